"""The Helm chart and tools/render.py: real helm (4 and 3) renders and lints, render.py gives the same objects,
every object passes kubernetes-validate (1.30-1.35) or its published CRD, and bad values fail in both."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import k8s_checks
import kubernetes_validate
import pytest
import yaml
from chart_matrix import LAUNCHERS, MATRIX, RELEASE, SERVERS, entry_id, matrix_values, parse, render_py
from k8s_rules import admission, aistore, training_operator

from chartkit.objects import render
from imagenet_train.deployment import read_deployment
from imagenet_train.errors import RETRY_EXIT

from conftest import REPO as ROOT

CHART = ROOT / "helm" / "imagenet-train"
TOOLS = ROOT / ".tools" / "bin"
EXAMPLES = ROOT / "manifests" / "examples"
KUBE_VERSIONS = ["1.30.0", "1.35.0"]
VALIDATE_VERSIONS = ["1.30", "1.31", "1.32", "1.33", "1.34", "1.35"]
API_VERSIONS = [
    "kubeflow.org/v1/PyTorchJob",
    "trainer.kubeflow.org/v1alpha1/TrainJob",
    "jobset.x-k8s.io/v1alpha2/JobSet",
    "ais.nvidia.com/v1beta1/AIStore",
]
DEPLOYMENT_FILE = "/etc/imagenet-train/deployment.yaml"


def tool(name: str) -> str:
    path = TOOLS / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make k8s-tools` (make test does)")
    return str(path)


def meaning(objects: dict[tuple[str, str], dict]) -> dict[tuple[str, str], dict]:
    """The objects with each ConfigMap's YAML files parsed: Helm and PyYAML quote strings differently."""
    out = json.loads(json.dumps({f"{k[0]}/{k[1]}": v for k, v in objects.items()}))
    for obj in out.values():
        if obj["kind"] == "ConfigMap":
            obj["data"] = {n: yaml.safe_load(t) if n.endswith(".yaml") else t for n, t in obj["data"].items()}
    return out


def config_files(objects: dict) -> dict:
    """The training ConfigMap's files, parsed."""
    data = objects[("ConfigMap", f"{RELEASE}-imagenet-train-config")]["data"]
    return {name: yaml.safe_load(text) for name, text in data.items()}


def helm_template(helm: str, values_file: Path, kube_version: str) -> subprocess.CompletedProcess:
    api = [arg for version in API_VERSIONS for arg in ("--api-versions", version)]
    command = [helm, "template", RELEASE, str(CHART), "-f", str(values_file), "--kube-version", kube_version, *api]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> dict:
    """Every matrix entry through helm 4 (both kube versions), helm 3, and render.py."""
    helm, helm3 = tool("helm"), tool("helm3")
    work = tmp_path_factory.mktemp("matrix")
    files = {}
    for entry in MATRIX:
        path = work / f"{entry_id(entry)}.yaml"
        path.write_text(yaml.safe_dump(matrix_values(*entry)))
        files[entry] = path
    jobs = [
        (entry, binary, version)
        for entry in MATRIX
        for binary, version in [(helm, KUBE_VERSIONS[0]), (helm, KUBE_VERSIONS[1]), (helm3, KUBE_VERSIONS[1])]
    ]
    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(lambda job: helm_template(job[1], files[job[0]], job[2]), jobs))
    out: dict = {entry: {} for entry in MATRIX}
    for (entry, binary, version), result in zip(jobs, results, strict=True):
        assert result.returncode == 0, f"{entry_id(entry)} {binary} {version}: {result.stderr}"
        out[entry][f"{Path(binary).name}-{version}"] = parse(result.stdout)
    for entry in MATRIX:
        out[entry]["render.py"] = render_py(entry)
    return out


def test_matrix_covers_every_launcher_server_size_and_elastic_choice():
    assert len(MATRIX) == 63
    assert {e[0] for e in MATRIX} == set(LAUNCHERS) and {e[1] for e in MATRIX} == set(SERVERS)


@pytest.mark.parametrize("entry", MATRIX, ids=entry_id)
def test_helm_and_render_py_produce_identical_objects(rendered, entry):
    outputs = rendered[entry]
    reference = meaning(outputs["helm-1.35.0"])
    for source, objects in outputs.items():
        objects = meaning(objects)
        assert sorted(objects) == sorted(reference), f"{source}: different objects"
        for key in reference:
            assert objects[key] == reference[key], f"{source}: {key} differs"


def test_matrix_renders_the_expected_objects(rendered):
    for (launcher, server, nodes, _elastic), outputs in rendered.items():
        kinds = sorted(kind for kind, _ in outputs["render.py"])
        workload = {
            "pytorchjob": ["PyTorchJob"],
            "indexedjob": ["Job", "Service"],
            "trainjob": ["TrainJob"],
            "jobset": ["JobSet"],
        }[launcher]
        for kind in workload:
            assert kind in kinds
        if server == "nginx":
            assert {"ConfigMap", "Deployment", "PersistentVolumeClaim"} <= set(kinds)
        assert ("AIStore" in kinds) == (server == "aistore" and nodes > 1)
        assert "Pod" in kinds  # the helm test hook
        metrics = matrix_values(launcher, server, nodes, _elastic).get("metrics", {})
        assert ("PodMonitor" in kinds) == bool(metrics.get("enabled"))
        dashboard = metrics.get("enabled") and metrics.get("dashboard", {}).get("enabled", True)
        assert (("ConfigMap", f"{RELEASE}-imagenet-train-dashboard") in outputs["render.py"]) == bool(dashboard)


def unique_objects(rendered: dict) -> list[dict]:
    seen, objects = set(), []
    for outputs in rendered.values():
        for obj in outputs["render.py"].values():
            text = json.dumps(obj, sort_keys=True)
            if text not in seen:
                seen.add(text)
                objects.append(obj)
    return objects


def test_core_objects_pass_kubernetes_validate_strict_for_1_30_to_1_35(rendered):
    custom = set(k8s_checks.CRD_FILES)
    core = [o for o in unique_objects(rendered) if (o["apiVersion"], o["kind"]) not in custom]
    failures = []
    for obj, version in itertools.product(core, VALIDATE_VERSIONS):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:  # a missing schema is a failure, not a pass
            failures.append(f"{version} {obj['kind']}: no schema")
        except kubernetes_validate.ValidationError as error:
            failures.append(f"{version} {obj['kind']}/{obj['metadata']['name']}: {error.message}")
    assert not failures, "\n".join(failures[:20])
    assert {o["kind"] for o in core} == {
        "ServiceAccount",
        "ConfigMap",
        "PersistentVolumeClaim",
        "Service",
        "Deployment",
        "Job",
        "Pod",
        "NetworkPolicy",
    }
    print(f"kubernetes-validate --strict: {len(core)} distinct core objects x {len(VALIDATE_VERSIONS)} versions")


def test_custom_resources_match_their_published_crds_strictly(rendered):
    custom = [o for o in unique_objects(rendered) if (o["apiVersion"], o["kind"]) in k8s_checks.CRD_FILES]
    problems = [p for obj in custom for p in k8s_checks.crd_problems(obj)]
    assert not problems, "\n".join(problems[:20])
    assert {o["kind"] for o in custom} == {"PyTorchJob", "TrainJob", "JobSet", "AIStore", "PodMonitor"}
    print(f"CRD schemas: {len(custom)} distinct custom resources")


def test_the_strict_crd_check_catches_a_misspelt_field(rendered):
    job = next(o for o in unique_objects(rendered) if o["kind"] == "PyTorchJob")
    bad = json.loads(json.dumps(job))
    bad["spec"]["runPolicy"]["backofLimit"] = 3
    assert any("backofLimit" in p for p in k8s_checks.crd_problems(bad))


def test_pytorchjobs_pass_the_operator_webhook_rules(rendered):
    jobs = [o for o in unique_objects(rendered) if o["kind"] == "PyTorchJob"]
    problems = [p for job in jobs for p in training_operator.pytorchjob_problems(job)]
    assert not problems, problems
    single = rendered[("pytorchjob", "nginx", 1, False)]["render.py"][("PyTorchJob", f"{RELEASE}-imagenet-train")]
    assert list(single["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    elastic = rendered[("pytorchjob", "nginx", 2, True)]["render.py"][("PyTorchJob", f"{RELEASE}-imagenet-train")]
    assert list(elastic["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert elastic["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    assert elastic["spec"]["elasticPolicy"] == {
        "minReplicas": 1,
        "maxReplicas": 2,
        "maxRestarts": 2,
        "rdzvBackend": "c10d",
    }


def test_own_checks_names_selectors_ports_quantities_and_pod_security(rendered):
    problems = []
    for outputs in rendered.values():
        objects = list(outputs["render.py"].values())
        problems += k8s_checks.selector_problems(objects)
        for obj in objects:
            problems += k8s_checks.name_problems(obj) + k8s_checks.quantity_problems(obj)
            problems += k8s_checks.pod_problems(obj)
    assert not problems, "\n".join(sorted(set(problems))[:20])


def test_own_checks_catch_broken_objects():
    service = {
        "kind": "Service",
        "metadata": {"name": "9lives"},
        "spec": {"selector": {"app": "x"}, "ports": [{"port": 80, "targetPort": "http"}]},
    }
    deployment = {
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"app": "y"}},
            "template": {
                "metadata": {"labels": {"app": "y"}},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "ports": [{"name": "web"}],
                            "resources": {"limits": {"memory": "1 Gi"}},
                            "volumeMounts": [{"name": "gone", "mountPath": "/x"}],
                        }
                    ]
                },
            },
        },
    }
    assert k8s_checks.name_problems(service) and k8s_checks.selector_problems([service, deployment])
    assert k8s_checks.quantity_problems(
        {
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {"containers": [{"resources": {"limits": {"memory": "1 Gi"}}}]},
        }
    )
    assert any("no volume" in p for p in k8s_checks.pod_problems(deployment))


def deployment_of(rendered, launcher: str, server: str = "nginx", nodes: int = 2, elastic: bool = False):
    """What `launch --deployment` makes of the ConfigMap Helm rendered for this matrix entry."""
    return read_deployment(config_files(rendered[(launcher, server, nodes, elastic)]["helm-1.35.0"])["deployment.yaml"])


def image_entrypoint() -> list[str]:
    """The ENTRYPOINT of images/train/Dockerfile (NVIDIA's entrypoint first, then imagenet-train)."""
    line = next(x for x in (ROOT / "images/train/Dockerfile").read_text().splitlines() if x.startswith("ENTRYPOINT"))
    return json.loads(line.split(" ", 1)[1])


def test_every_pod_runs_launch_on_the_rendered_config_files(rendered):
    entrypoint = image_entrypoint()
    for outputs in rendered.values():
        objects = outputs["render.py"]
        config = objects[("ConfigMap", f"{RELEASE}-imagenet-train-config")]
        for obj in objects.values():
            if obj["kind"] == "TrainJob":
                assert obj["spec"]["trainer"]["args"][:3] == [
                    "launch",
                    "--deployment",
                    "/etc/imagenet-train/deployment.yaml",
                ]
                # The runtime's command is replaced by the image's own entrypoint, not by a bare imagenet-train
                # that would skip NVIDIA's CUDA set-up.
                assert obj["spec"]["trainer"]["command"] == entrypoint
            for pod in k8s_checks.pod_templates(obj):
                for box in pod["spec"]["containers"]:
                    if box.get("image", "").split(":")[0].endswith("/imagenet-train"):
                        assert "command" not in box, box  # the image's entrypoint runs
                    if box.get("args") and box["args"][0] in ("launch", "fill", "probe"):
                        assert box["args"][1:3] == ["--deployment", DEPLOYMENT_FILE]
                        assert "env" not in box  # launch sets the environment from deployment.yaml
        assert set(config["data"]) == {"train.yaml", "deployment.yaml"}


def test_launch_turns_the_rendered_deployment_into_torchrun_and_training_flags(rendered):
    job = deployment_of(rendered, "indexedjob")
    assert job.env["MASTER_ADDR"] == f"{RELEASE}-imagenet-train-0.{RELEASE}-imagenet-train" and job.env["NNODES"] == "2"
    assert (job.nproc, job.wait_for, job.wait_timeout) == (
        8,
        f"http://{RELEASE}-imagenet-train-shards/shards.json",
        1800,
    )
    metrics = ["--metrics-port", "9400"]  # the matrix's 2-node entries turn metrics on
    assert job.train_flags == ["--shards", job.wait_for, "--run-dir", f"/results/{RELEASE}", *metrics]
    jobset = deployment_of(rendered, "jobset", nodes=4, elastic=True)
    assert jobset.env["MASTER_ADDR"] == f"{RELEASE}-imagenet-train-node-0-0.{RELEASE}-imagenet-train"
    assert jobset.env["PET_NNODES"] == "1:4" and jobset.env["PET_RDZV_ENDPOINT"].endswith(":29500")
    assert jobset.train_flags[-6:-2] == ["--results", f"gs://acme-runs/imagenet/{RELEASE}", "--cache-dir", "/cache"]
    assert jobset.train_flags[-2:] == ["--cache-max-bytes", str(int(500 * 2**30 * 0.9))]  # 9/10 of cache.sizeLimit
    bucket = deployment_of(rendered, "pytorchjob", "bucket")
    assert bucket.wait_for == "" and bucket.train_flags[1] == "gs://acme-data/imagenet/shards/shards.json"
    assert bucket.env == {"GOOGLE_APPLICATION_CREDENTIALS": "/var/run/secrets/gcp/key.json"}
    ais = deployment_of(rendered, "trainjob", "aistore")
    assert ais.env == {"AIS_ENDPOINT": f"http://{RELEASE}-imagenet-train-ais-proxy:51080"}
    assert ais.train_flags[1] == "ais://imagenet/shards.json"
    assert deployment_of(rendered, "pytorchjob", nodes=1).nproc == 2
    assert deployment_of(rendered, "pytorchjob").env == {}  # the operator sets PET_*


def test_the_train_values_are_the_training_config_file(rendered):
    objects = rendered[("pytorchjob", "nginx", 2, False)]["helm-1.35.0"]
    assert config_files(objects)["train.yaml"] == {
        "global_batch_size": 1024,
        "lr": 0.4,
        "hflip": False,
        "resume": "latest",
        "preflight": True,
    }
    pods = [p for o in objects.values() for p in k8s_checks.pod_templates(o) if o["kind"] == "PyTorchJob"]
    limits = pods[0]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 8
    cpu = rendered[("pytorchjob", "nginx", 1, False)]["helm-1.35.0"]
    cpu_pods = [p for o in cpu.values() for p in k8s_checks.pod_templates(o) if o["kind"] == "PyTorchJob"]
    assert "nvidia.com/gpu" not in cpu_pods[0]["spec"]["containers"][0]["resources"]["limits"]


def test_the_shard_server_config_map_carries_the_image_nginx_conf_unchanged(rendered):
    objects = rendered[("pytorchjob", "nginx", 2, False)]["helm-1.35.0"]
    config = objects[("ConfigMap", f"{RELEASE}-imagenet-train-shards")]
    assert config["data"]["shard-server.conf"] == (ROOT / "images" / "shard-server" / "nginx.conf").read_text()
    assert "include /etc/nginx/imagenet-train/shard-server.conf;" in config["data"]["default.conf"]


@pytest.mark.parametrize("helm_name", ["helm", "helm3"])
def test_helm_lint_strict_is_clean_for_defaults_and_examples(helm_name):
    helm = tool(helm_name)
    for values in [None, *sorted(EXAMPLES.glob("*.values.yaml"))]:
        extra = ["-f", str(values)] if values else []
        result = subprocess.run([helm, "lint", "--strict", str(CHART), *extra], capture_output=True, text=True)
        assert result.returncode == 0, f"{values}: {result.stdout}{result.stderr}"
        assert "0 chart(s) failed" in result.stdout


def test_chart_refuses_kubernetes_older_than_1_30(tmp_path):
    values = tmp_path / "v.yaml"
    values.write_text("{}\n")
    result = helm_template(tool("helm"), values, "1.29.0")
    assert result.returncode != 0 and "kubeVersion" in result.stderr


NEGATIVE = [
    ({"launcher": {"kind": "slurm"}}, "launcher.kind"),
    ({"launcher": {"nodes": 0}}, "launcher.nodes"),
    ({"launcher": {"nodes": "two"}}, "launcher.nodes"),
    ({"launcher": {"nodez": 2}}, "launcher.nodez"),
    ({"train": {"mode": "exact"}}, "train.mode"),
    ({"train": {"batchsize": 64}}, "train.batchsize"),
    ({"train": {"lr": 0}}, "train.lr"),
    ({"train": {"shards": "http://elsewhere/shards.json"}}, "train.shards"),
    ({"shards": {"server": "s3"}}, "shards.server"),
    ({"shards": {"server": "bucket"}}, "shards.bucket.url"),
    ({"shards": {"server": "aistore"}}, "shards.aistore.endpoint"),
    ({"shards": {"nginx": {"fill": {"enabled": True}}}}, "shards.nginx.fill.from"),
    ({"results": {"bucket": "s3://runs"}}, "results.bucket"),
    ({"resources": {"limits": {"memory": "lots"}}}, "resources.limits.memory"),
    ({"image": {"repository": ""}}, "image.repository"),
    ({"image": {"digest": "sha256:0123abc"}}, "image.digest"),
    ({"image": {"digest": "v0.1.0"}}, "image.digest"),
    ({"launcher": {"kind": "trainjob", "elastic": {"enabled": True}}}, "launcher.elastic.enabled"),
    ({"launcher": {"kind": "jobset", "restartPolicy": "ExitCode"}}, "launcher.restartPolicy"),
    ({"launcher": {"kind": "trainjob"}, "priorityClassName": "high"}, "priorityClassName"),
    ({"launcher": {"kind": "trainjob"}, "hostNetwork": True}, "hostNetwork"),
    ({"launcher": {"kind": "trainjob"}, "schedulerName": "volcano"}, "schedulerName"),
    ({"addCapabilities": ["ipc_lock"]}, "addCapabilities"),
    # Maps merge with the default's hostPath: a second mode without `hostPath: null` is two modes.
    ({"shards": {"aistore": {"stateStorage": {"pvc": {"storageClass": "fast"}}}}}, "shards.aistore.stateStorage"),
    ({"shards": {"nginx": {"replicas": 3}}}, "shards.nginx.volume.accessModes"),
    ({"launcher": {"placement": {"requiredTopology": "rack"}}}, "launcher.runPolicy.kueueQueue"),
    (
        {
            "launcher": {
                "runPolicy": {"kueueQueue": "q"},
                "placement": {"requiredTopology": "rack", "preferredTopology": "block"},
            }
        },
        "launcher.placement.preferredTopology",
    ),
    (
        {"launcher": {"kind": "pytorchjob", "placement": {"exclusiveTopology": "pool"}}},
        "launcher.placement.exclusiveTopology",
    ),
    ({"launcher": {"placement": {"requiredTopology": "not a label key"}}}, "launcher.placement.requiredTopology"),
    ({"train": {"metrics_port": 9400}}, "train.metrics_port"),  # the chart's metrics.port sets it
    ({"metrics": {"port": 80}}, "metrics.port"),
    ({"metrics": {"podMonitor": {"interval": "30 seconds"}}}, "metrics.podMonitor.interval"),
    ({"metrics": {"dashboard": {"labels": {"grafana_dashboard": 1}}}}, "metrics.dashboard.labels.grafana_dashboard"),
]


@pytest.mark.parametrize("values,field", NEGATIVE, ids=[f for _, f in NEGATIVE])
def test_bad_values_fail_in_helm_and_render_py_naming_the_field(tmp_path, values, field):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    for helm in (tool("helm"), tool("helm3")):
        result = helm_template(helm, path, KUBE_VERSIONS[1])
        assert result.returncode != 0 and result.stdout == "", f"{helm} accepted {values}"
        assert field.split(".")[-1] in result.stderr, f"{helm}: {result.stderr}"
    script = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "render.py"), "-f", str(path)], capture_output=True, text=True
    )
    assert script.returncode == 2 and script.stdout == ""
    assert script.stderr.startswith(f"render.py: error: values: {field}") and script.stderr.count("\n") == 1


# Rules JSON Schema cannot state: the pods' `launch`, render.py and ngc.py share imagenet_train.deployment.
RULES = [
    (
        {"launcher": {"nprocPerNode": 3}},
        "launcher.nprocPerNode: 3 processes cannot each own one of the 8 GPUs in resources.limits",
    ),
    (
        {"launcher": {"nodes": 3, "elastic": {"enabled": True, "maxNodes": 2}}},
        "launcher.elastic: nodes=3 must lie between minNodes=1 and maxNodes=2",
    ),
    # What an operator's webhook or the API server would refuse at apply time is refused before (k8s_rules/).
    (
        {"launcher": {"kind": "jobset", "nodes": 16}, "fullnameOverride": "a" * 50},
        f"the JobSet webhook refuses '{'a' * 50}': JobSet name is too long, pod names generated for this JobSet "
        "will exceed 63 characters",
    ),
    (
        {"launcher": {"kind": "pytorchjob"}, "fullnameOverride": "1st-run"},
        "the workload name '1st-run' is refused by the API server: a DNS-1035 label must consist",
    ),
    (
        {"metrics": {"enabled": True, "port": 29496}},
        "metrics.port: the metrics ports 29496..29503 take launcher.port 29500 (torchrun's rendezvous)",
    ),
]


@pytest.mark.parametrize("values,message", RULES, ids=[m.split(":")[0][:40] for _, m in RULES])
def test_cross_field_rules_give_one_message_in_render_py_and_in_the_pods_launch(tmp_path, values, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    script = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "render.py"), "-f", str(path)], capture_output=True, text=True
    )
    assert script.returncode == 2 and script.stdout == "" and message in script.stderr, script.stderr
    helm = helm_template(tool("helm"), path, KUBE_VERSIONS[1])
    assert helm.returncode == 0, helm.stderr  # Helm cannot judge these; the pod's launch does, before torchrun
    config = next(o for o in parse(helm.stdout).values() if "deployment.yaml" in o.get("data", {}))
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text(config["data"]["deployment.yaml"])
    launch = subprocess.run(
        [sys.executable, "-m", "imagenet_train.cli", "launch", "--dry-run", "--deployment", str(deployment)],
        capture_output=True,
        text=True,
    )
    assert launch.returncode == 2 and message in launch.stderr and launch.stderr.count("\n") == 1, launch.stderr


RULE_WORDS = [
    (
        {"launcher": {"kind": "trainjob", "elastic": {"enabled": True}}},
        "expected launcher.elastic.enabled = false when launcher.kind = trainjob (trainjob has no elastic policy: "
        "use pytorchjob, indexedjob or jobset)",
    ),
    (
        {"shards": {"nginx": {"fill": {"enabled": True}}}},
        "expected from is set when enabled = true (a fill needs its source)",
    ),
]


@pytest.mark.parametrize("values,words", RULE_WORDS, ids=["elastic-trainjob", "fill-source"])
def test_helm_4_and_helm_3_name_what_a_broken_rule_expects_and_why(tmp_path, values, words):
    # Helm prints a validator's words only ("value must be false"): the schema's rules carry theirs in a key.
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    helm4 = helm_template(tool("helm"), path, KUBE_VERSIONS[1])
    assert helm4.returncode != 0 and f"missing property '{words}'" in helm4.stderr, helm4.stderr
    helm3 = helm_template(tool("helm3"), path, KUBE_VERSIONS[1])
    assert helm3.returncode != 0 and f": {words} is required" in helm3.stderr, helm3.stderr


def test_helm_3_names_the_kind_an_optional_value_failed_not_that_it_is_not_empty(tmp_path):
    # Of anyOf's alternatives that fail alike Helm 3 reports the first: the kind comes before the empty one.
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"shards": {"nginx": {"fill": {"from": "s3://acme/shards"}}}}))
    helm3 = helm_template(tool("helm3"), path, KUBE_VERSIONS[1])
    assert helm3.returncode != 0 and "shards.nginx.fill.from: Does not match pattern '^gs://" in helm3.stderr
    assert "String length must be less than or equal to 0" not in helm3.stderr, helm3.stderr


# The chart states this rule too (templates/_validation.tpl), in the words of imagenet_train.deployment.
UNEVEN_BATCHES = [
    (
        {"launcher": {"nodes": 3}, "train": {"global_batch_size": 1000}},
        "train.global_batch_size: 1000 does not divide over 24 ranks; expected a multiple of 24",
    ),
    (
        {"launcher": {"nodes": 3, "nprocPerNode": 0}, "train": {"global_batch_size": 1000, "grad_accum_steps": 2}},
        "train.global_batch_size: 1000 does not divide over 24 ranks x 2 train.grad_accum_steps; expected a multiple "
        "of 48",
    ),
    (
        {
            "launcher": {"nodes": 2},
            "resources": {"limits": {"nvidia.com/gpu": "4"}},
            "train": {"global_batch_size": 12},
        },
        "train.global_batch_size: 12 does not divide over 8 ranks; expected a multiple of 8",
    ),
]


@pytest.mark.parametrize("values,message", UNEVEN_BATCHES, ids=["ranks", "ranks-x-accumulation", "gpus-as-text"])
def test_a_global_batch_that_does_not_divide_over_the_ranks_is_one_line_in_helm_4_helm_3_and_render_py(
    tmp_path, values, message
):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    for helm in (tool("helm"), tool("helm3")):
        result = helm_template(helm, path, KUBE_VERSIONS[1])
        assert result.returncode != 0 and result.stdout == "", f"{helm} accepted {values}"
        assert f"templates/validation.yaml:2:4): {message}\n" in result.stderr, f"{helm}: {result.stderr}"
    script = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "render.py"), "-f", str(path)], capture_output=True, text=True
    )
    assert script.returncode == 2 and script.stderr == f"render.py: error: {message}\n", script.stderr
    fitting = {**values, "train": {**values["train"], "global_batch_size": int(message.rsplit(" ", 1)[1]) * 10}}
    path.write_text(yaml.safe_dump(fitting))
    assert helm_template(tool("helm"), path, KUBE_VERSIONS[1]).returncode == 0


def test_render_py_merges_values_files_like_helm(tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(
        "launcher: {nodes: 4}\ntrain: {lr: 0.4, epochs: 10}\nnodeSelector: {a: b}\n"
        "tolerations: [{key: gpu, operator: Exists}]\n"
    )
    second.write_text("launcher: {nodes: 2}\nnodeSelector: null\ntrain: {epochs: 5}\nresults: {runName: exp-1}\n")
    files = ["-f", str(first), "-f", str(second)]
    helm = subprocess.run([tool("helm"), "template", RELEASE, str(CHART), *files], capture_output=True, text=True)
    assert helm.returncode == 0, helm.stderr
    script = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "render.py"), "--release", RELEASE, *files],
        capture_output=True,
        text=True,
    )
    assert script.returncode == 0, script.stderr
    assert meaning(parse(script.stdout)) == meaning(parse(helm.stdout))
    objects = parse(script.stdout)
    job = objects[("PyTorchJob", f"{RELEASE}-imagenet-train")]
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert master["tolerations"] == [{"key": "gpu", "operator": "Exists"}] and "nodeSelector" not in master
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    config = config_files(objects)
    assert config["train.yaml"] == {"lr": 0.4, "epochs": 5, "resume": "latest", "preflight": True}
    assert read_deployment(config["deployment.yaml"]).train_flags[3] == "/results/exp-1"


def _selects(selector: dict, template: dict) -> bool:
    return selector.items() <= template["metadata"].get("labels", {}).items()


def _pods(objects: dict) -> tuple[list[dict], list[dict]]:
    """(the training pods' templates, every other pod template) of one render."""
    training, others = [], []
    for obj in objects.values():
        trains = obj["kind"] in ("PyTorchJob", "JobSet", "TrainJob") or (
            obj["kind"] == "Job" and obj["metadata"]["labels"].get("app.kubernetes.io/component") == "trainer"
        )
        (training if trains else others).extend(k8s_checks.pod_templates(obj))
    return training, others


def _only_peer(policy: dict) -> tuple[dict, dict]:
    """The one ingress rule of a policy and its one peer: pods of this namespace chosen by labels, nothing else."""
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert list(peer) == ["podSelector"] and list(peer["podSelector"]) == ["matchLabels"]
    return rule, peer["podSelector"]["matchLabels"]


def _another_release(template: dict) -> dict:
    labels = {**template["metadata"]["labels"], "app.kubernetes.io/instance": "someone-else"}
    return {"metadata": {"labels": labels}}


def test_network_policies_let_only_the_jobs_own_pods_reach_its_store_and_shard_server(rendered):
    for entry, outputs in rendered.items():
        for source, objects in outputs.items():
            where = f"{entry_id(entry)} {source}"
            policies = {name: o for (kind, name), o in objects.items() if kind == "NetworkPolicy"}
            trainer = policies.pop(f"{RELEASE}-imagenet-train-trainer")
            shards = policies.pop(f"{RELEASE}-imagenet-train-shards", None)
            assert not policies and (shards is not None) == (entry[1] == "nginx"), where
            training, others = _pods(objects)
            assert training and all(_selects(trainer["spec"]["podSelector"]["matchLabels"], t) for t in training)
            assert not any(_selects(trainer["spec"]["podSelector"]["matchLabels"], t) for t in others), where
            # Every port (the c10d store on launcher.port, NCCL's and Gloo's own), from this job's trainers only;
            # with metrics on, a second rule admits the scraper to the metrics ports (checked below).
            scraper = trainer["spec"]["ingress"][1:]
            assert len(scraper) == int(bool(_metrics(entry))), where
            trainer = {**trainer, "spec": {**trainer["spec"], "ingress": trainer["spec"]["ingress"][:1]}}
            rule, peer = _only_peer(trainer)
            assert "ports" not in rule and all(_selects(peer, t) for t in training), where
            assert not any(_selects(peer, t) for t in others + [_another_release(t) for t in training]), where
            if shards is None:
                continue
            server = objects[("Deployment", f"{RELEASE}-imagenet-train-shards")]["spec"]["template"]
            chosen = [t for t in training + others if _selects(shards["spec"]["podSelector"]["matchLabels"], t)]
            assert chosen == [server], where
            rule, peer = _only_peer(shards)
            named = {p["name"] for p in server["spec"]["containers"][0]["ports"]}
            assert rule["ports"] == [{"port": "http", "protocol": "TCP"}] and "http" in named
            helm_test = [t for t in others if t["metadata"]["labels"]["app.kubernetes.io/component"] == "test"]
            assert helm_test and all(_selects(peer, t) for t in training + helm_test), where
            assert not any(_selects(peer, _another_release(t)) for t in training), where


def test_network_policies_are_off_with_network_policy_enabled_false(tmp_path):
    path = tmp_path / "off.yaml"
    path.write_text(yaml.safe_dump({"networkPolicy": {"enabled": False}}))
    renders = {"render.py": parse(render([str(path)], release=RELEASE))}
    for helm in ("helm", "helm3"):
        result = helm_template(tool(helm), path, KUBE_VERSIONS[1])
        assert result.returncode == 0, result.stderr
        renders[helm] = parse(result.stdout)
    for source, objects in renders.items():
        assert "NetworkPolicy" not in {kind for kind, _ in objects}, source
        assert ("Deployment", f"{RELEASE}-imagenet-train-shards") in objects  # the rest is unchanged


def test_examples_are_up_to_date_with_the_templates():
    stale = []
    for values in sorted(EXAMPLES.glob("*.values.yaml")):
        target = values.with_name(values.name.replace(".values.yaml", ".yaml"))
        if not target.exists() or target.read_text() != render([str(values)], release=RELEASE):
            stale.append(target.name)
    assert not stale, f"stale examples {stale}: run `make manifests`"
    assert len(list(EXAMPLES.glob("*.values.yaml"))) >= 3


def test_kubectl_parses_the_render_py_stream():
    kubectl = tool("kubectl")
    for values in sorted(EXAMPLES.glob("*.values.yaml")):
        stream = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "render.py"), "--release", RELEASE, "-f", str(values)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        result = subprocess.run(
            [kubectl, "annotate", "--local", "-f", "-", "x=y", "-o", "name"],
            input=stream,
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, f"{values.name}: {result.stderr}"
        names = sorted((n.split("/", 1)[0].split(".")[0], n.split("/", 1)[1]) for n in result.stdout.split())
        assert names == sorted((kind.lower(), name) for kind, name in parse(stream)), names


def test_documented_pipeline_hands_kubectl_apply_a_well_formed_stream(tmp_path):
    """`tools/render.py -f values.yaml | kubectl apply -f -` with a recording kubectl on PATH."""
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(
        f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {record}.argv\ncat > {record}.stdin\necho applied\n"
    )
    (bin_dir / "kubectl").chmod(0o755)
    values = EXAMPLES / "pytorchjob-nginx-2x8.values.yaml"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    pipeline = f"set -o pipefail; {sys.executable} tools/render.py --release {RELEASE} -f {values} | kubectl apply -f -"
    result = subprocess.run(["bash", "-c", pipeline], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "applied\n", result.stderr
    assert Path(f"{record}.argv").read_text().split() == ["apply", "-f", "-"]
    stream = Path(f"{record}.stdin").read_text()
    assert parse(stream) == parse((EXAMPLES / "pytorchjob-nginx-2x8.yaml").read_text())
    real = subprocess.run(
        [tool("kubectl"), "annotate", "--local", "-f", "-", "x=y", "-o", "name"],
        input=stream,
        capture_output=True,
        text=True,
    )
    assert real.returncode == 0 and len(real.stdout.split()) == len(parse(stream))


def test_a_packaged_chart_carries_the_nginx_conf_itself_not_a_link(tmp_path):
    result = subprocess.run([tool("helm"), "package", str(CHART), "-d", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    with tarfile.open(next(tmp_path.glob("imagenet-train-*.tgz"))) as package:
        member = package.getmember("imagenet-train/files/nginx.conf")
        assert member.isreg()
        assert package.extractfile(member).read() == (ROOT / "images" / "shard-server" / "nginx.conf").read_bytes()


# The day-one cluster failures (issue: the chart's pods run for real), one test each.


def trainer_pods(objects: dict) -> list[dict]:
    workloads = ("PyTorchJob", "Job", "JobSet", "TrainJob")
    return [
        pod
        for obj in objects.values()
        if obj["kind"] in workloads
        and obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "trainer"
        for pod in k8s_checks.pod_templates(obj)
    ]


def test_every_path_a_training_pod_writes_is_on_a_declared_writable_volume(rendered):
    from imagenet_train.deployment import WRITABLE_ENV

    for entry, outputs in rendered.items():
        objects = outputs["render.py"]
        for pod in trainer_pods(objects):
            for box in pod["spec"]["containers"]:
                if box["name"] not in ("pytorch", "node"):
                    continue
                assert box["securityContext"]["readOnlyRootFilesystem"] is True
                writable = [m["mountPath"] for m in box["volumeMounts"] if not m.get("readOnly")]
                for name, path in WRITABLE_ENV.items():
                    assert any(path == m or path.startswith(m + "/") for m in writable), (entry, name, path)


def test_the_fill_job_runs_on_the_shard_servers_node_and_the_server_restarts_with_recreate(rendered):
    objects = rendered[("pytorchjob", "nginx", 4, False)]["helm-1.35.0"]
    server = objects[("Deployment", f"{RELEASE}-imagenet-train-shards")]
    assert server["spec"]["strategy"] == {"type": "Recreate"}
    fill = objects[("Job", f"{RELEASE}-imagenet-train-fill")]["spec"]["template"]["spec"]
    (term,) = fill["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == server["spec"]["selector"]["matchLabels"]
    assert "nodeSelector" not in fill and "tolerations" not in fill  # the GPU nodes' placement is not the server's


def test_a_deployed_aistore_passes_the_operators_webhook_rules(rendered):
    clusters = [o for o in unique_objects(rendered) if o["kind"] == "AIStore"]
    assert clusters and all(not aistore.aistore_problems(c) for c in clusters)
    assert clusters[0]["spec"]["stateStorage"] == {"hostPath": {"prefix": "/etc/ais"}}
    without = json.loads(json.dumps(clusters[0]))
    del without["spec"]["stateStorage"]
    assert aistore.aistore_problems(without) == ["spec does not define stateStorage (hostPath, pvc or emptyDir)"]
    both = json.loads(json.dumps(clusters[0]))
    both["spec"]["stateStorage"]["emptyDir"] = {}
    assert aistore.aistore_problems(both)


def test_a_failure_in_a_static_run_restarts_or_ends_the_whole_world_never_one_pod(rendered):
    name = f"{RELEASE}-imagenet-train"
    static = rendered[("pytorchjob", "nginx", 2, False)]["render.py"][("PyTorchJob", name)]["spec"]
    assert {r["restartPolicy"] for r in static["pytorchReplicaSpecs"].values()} == {"ExitCode"}
    assert static["runPolicy"]["cleanPodPolicy"] == "Running"
    elastic = rendered[("pytorchjob", "nginx", 2, True)]["render.py"][("PyTorchJob", name)]["spec"]
    assert elastic["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "OnFailure"
    job = rendered[("indexedjob", "nginx", 2, False)]["render.py"][("Job", name)]["spec"]
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    rules = job["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    # Ranks that stopped at a pre-emption's checkpoint are replaced without counting; the program's own error or
    # bad input fails the Job; anything else is counted, the killed pod's 137 and the others' RETRY_EXIT too (a
    # fault that recurs on every restart must end at backoffLimit).
    by_code = [(r["action"], r["onExitCodes"]["operator"], r["onExitCodes"]["values"]) for r in rules[1:]]
    assert by_code == [("Ignore", "In", [143]), ("FailJob", "In", [1, 2])]
    assert not any(RETRY_EXIT in codes for _, _, codes in by_code)
    assert "podFailurePolicy" not in rendered[("indexedjob", "nginx", 2, True)]["render.py"][("Job", name)]["spec"]
    jobset = rendered[("jobset", "nginx", 2, False)]["render.py"][("JobSet", name)]["spec"]
    template = jobset["replicatedJobs"][0]["template"]["spec"]
    assert template["backoffLimit"] == 0 and template["template"]["spec"]["restartPolicy"] == "Never"
    assert jobset["failurePolicy"]["maxRestarts"] == 3


def test_nginx_serves_large_shards_through_the_page_cache_with_cheap_probes(rendered):
    conf = (ROOT / "images" / "shard-server" / "nginx.conf").read_text()
    assert not [line for line in conf.splitlines() if line.strip().startswith("directio")]
    assert "location = /healthz" in conf
    objects = rendered[("pytorchjob", "nginx", 2, False)]["helm-1.35.0"]
    nginx = objects[("Deployment", f"{RELEASE}-imagenet-train-shards")]["spec"]["template"]["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        assert nginx[probe]["httpGet"]["path"] == "/healthz" and nginx[probe]["timeoutSeconds"] >= 5
    main = objects[("ConfigMap", f"{RELEASE}-imagenet-train-shards")]["data"]["nginx.conf"]
    assert "worker_connections 4096;" in main
    assert {"name": "main", "mountPath": "/etc/nginx/nginx.conf", "subPath": "nginx.conf", "readOnly": True} in (
        nginx["volumeMounts"]
    )


def test_gpu_cluster_settings_reach_every_launchers_pods_in_helm_and_render_py(tmp_path):
    hatches = {
        "podAnnotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"},
        "podLabels": {"kueue.x-k8s.io/podset": "trainers"},
        "hostNetwork": True,
        "addCapabilities": ["IPC_LOCK"],
        "schedulerName": "volcano",
        "terminationGracePeriodSeconds": 300,
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}
        ],
        "extraVolumes": [{"name": "rdma", "hostPath": {"path": "/dev/infiniband"}}],
        "extraVolumeMounts": [{"name": "rdma", "mountPath": "/dev/infiniband"}],
    }
    runtime_owned = ("hostNetwork", "schedulerName", "topologySpreadConstraints")
    for launcher in LAUNCHERS:
        chosen = {k: v for k, v in hatches.items() if launcher != "trainjob" or k not in runtime_owned}
        values = {**chosen, "launcher": {"kind": launcher, "runPolicy": {"kueueQueue": "lq", "volcanoQueue": "vq"}}}
        values["launcher"]["runPolicy"]["minAvailable"] = 2
        path = tmp_path / f"{launcher}.yaml"
        path.write_text(yaml.safe_dump(values))
        helm = helm_template(tool("helm"), path, KUBE_VERSIONS[1])
        assert helm.returncode == 0, helm.stderr
        objects = parse(helm.stdout)
        assert meaning(objects) == meaning(parse(render([str(path)], release=RELEASE)))
        workload = next(o for o in objects.values() if o["kind"] in ("PyTorchJob", "Job", "JobSet", "TrainJob"))
        assert workload["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "lq"
        if launcher == "pytorchjob":
            assert workload["spec"]["runPolicy"]["schedulingPolicy"] == {"queue": "vq", "minAvailable": 2}
        for pod in trainer_pods(objects):
            spec, box = pod["spec"], pod["spec"]["containers"][0]
            assert pod["metadata"]["annotations"] == hatches["podAnnotations"]
            assert pod["metadata"]["labels"]["kueue.x-k8s.io/podset"] == "trainers"
            assert spec["terminationGracePeriodSeconds"] == 300
            if launcher != "trainjob":
                assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
                assert spec["schedulerName"] == "volcano"
                assert spec["topologySpreadConstraints"] == hatches["topologySpreadConstraints"]
            assert box["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
            assert {"name": "rdma", "mountPath": "/dev/infiniband"} in box["volumeMounts"]
            assert {"name": "rdma", "hostPath": {"path": "/dev/infiniband"}} in spec["volumes"]
        for obj in objects.values():
            if (obj["apiVersion"], obj["kind"]) in k8s_checks.CRD_FILES:
                assert not k8s_checks.crd_problems(obj)
            else:
                kubernetes_validate.validate(obj, VALIDATE_VERSIONS[-1], strict=True)


PUSHED = "127.0.0.1:5000/acme/imagenet-train"
DIGEST = "sha256:" + "4f0c" * 16


def images(node) -> set[str]:
    """Every `image` an object names (containers, init containers, a TrainJob's spec.trainer)."""
    if isinstance(node, dict):
        own = {node["image"]} if isinstance(node.get("image"), str) else set()
        return own.union(*(images(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(images(v) for v in node))
    return set()


def test_image_digest_pins_every_training_pod_to_what_was_pushed_in_helm_and_render_py(tmp_path):
    """image.digest (as `make push` prints it): REPOSITORY@DIGEST in every pod that runs imagenet-train, the tag
    ignored, in objects kubernetes-validate, the CRDs, their CEL rules and the operators' webhooks admit."""
    fill = {"nginx": {"fill": {"enabled": True, "from": "gs://acme-data/imagenet/shards"}}}
    for launcher in LAUNCHERS:
        values = {"image": {"repository": PUSHED, "tag": "v0.1.0", "digest": DIGEST}, "launcher": {"kind": launcher}}
        path = tmp_path / f"{launcher}.yaml"
        path.write_text(yaml.safe_dump({**values, "shards": fill}))
        for helm in (tool("helm"), tool("helm3")):
            result = helm_template(helm, path, KUBE_VERSIONS[1])
            assert result.returncode == 0, result.stderr
            objects = parse(result.stdout)
            assert meaning(objects) == meaning(parse(render([str(path)], release=RELEASE)))
        named = {obj["kind"]: images(obj) for obj in objects.values() if images(obj)}
        # The workload, the fill Job and the helm test pod run imagenet-train; the shard server is nginx.
        assert named.pop("Deployment") == {"nginxinc/nginx-unprivileged:1.28"}
        assert named and all(found == {f"{PUSHED}@{DIGEST}"} for found in named.values()), named
        for obj in objects.values():
            if (obj["apiVersion"], obj["kind"]) in k8s_checks.CRD_FILES:
                assert admission.admit(obj).problems == []
            else:
                kubernetes_validate.validate(obj, VALIDATE_VERSIONS[-1], strict=True)
    tagged = {"image": {"repository": PUSHED, "tag": "v0.1.0"}, "launcher": {"kind": "trainjob"}}  # no digest
    path.write_text(yaml.safe_dump(tagged))
    assert images(parse(render([str(path)], release=RELEASE))[("TrainJob", f"{RELEASE}-imagenet-train")]) == {
        f"{PUSHED}:v0.1.0"
    }


def test_notes_and_docs_state_version_requirements_and_upgrade_behaviour(tmp_path):
    notes = {}
    for launcher in LAUNCHERS:
        path = tmp_path / f"{launcher}.yaml"
        path.write_text(yaml.safe_dump({"launcher": {"kind": launcher}}))
        result = subprocess.run(
            [tool("helm"), "install", RELEASE, str(CHART), "-f", str(path), "--dry-run=client"],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
        notes[launcher] = result.stdout.split("NOTES:", 1)[1]
    assert "Kubeflow Trainer v2.2" in notes["trainjob"]
    for launcher in ("indexedjob", "jobset", "trainjob"):
        assert "helm upgrade cannot change" in notes[launcher]
    page = (ROOT / "docs" / "kubernetes.md").read_text()
    assert "Kubeflow Trainer v2.2" in page and "helm upgrade cannot change" in page


def test_the_tests_read_nothing_outside_the_repository():
    outside = []
    for path in (ROOT / "tests").rglob("*.py"):
        text = path.read_text() if path != Path(__file__) else ""
        if "parents[2]" in text or '"shared"' in text or "/work/" in text:
            outside.append(path.name)
    assert not outside, outside
    assert {p.name for p in (ROOT / "tests" / "crds").glob("*.yaml")} == set(k8s_checks.CRD_FILES.values()) | {
        "trainer.kubeflow.org_clustertrainingruntimes.yaml",
        "trainer.kubeflow.org_trainingruntimes.yaml",
    }


def trainers(objects: dict) -> list[dict]:
    """The training workload of a render (PyTorchJob, Job, JobSet or TrainJob)."""
    return [
        obj
        for obj in objects.values()
        if obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "trainer"
        and obj["kind"] in ("PyTorchJob", "Job", "JobSet", "TrainJob")
    ]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_kueue_placement_and_priority_reach_every_launchers_job_and_pod_template(rendered, launcher):
    # The 4-node entries ask Kueue for a queue, a priority and a topology level (chart_matrix.matrix_values).
    for elastic in (False, True) if launcher != "trainjob" else (False,):
        for engine, objects in rendered[(launcher, "nginx", 4, elastic)].items():
            jobs = trainers(objects)
            assert len(jobs) == 1, (engine, [obj["kind"] for obj in objects.values()])
            job = jobs[0]
            assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a", engine
            assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high", engine
            level = "preferred" if elastic else "required"
            templates = list(k8s_checks.pod_templates(job))
            assert templates, engine
            for template in templates:
                annotations = template["metadata"]["annotations"]
                assert annotations[f"kueue.x-k8s.io/podset-{level}-topology"] == "cloud.google.com/gce-topology-block"
            exclusive = job["metadata"].get("annotations", {}).get("alpha.jobset.sigs.k8s.io/exclusive-topology")
            assert exclusive == ("cloud.google.com/gke-nodepool" if launcher == "jobset" else None), engine


def test_without_placement_values_no_kueue_annotation_is_rendered(rendered):
    for entry, engines in rendered.items():
        if entry[2] == 4:
            continue
        text = json.dumps([list(objects.values()) for objects in engines.values()])
        assert "kueue.x-k8s.io/podset" not in text and "exclusive-topology" not in text, entry


# -- metrics: the training command's --metrics-port, the ports, the PodMonitor, the dashboard, the policy --------------


def _metrics(entry: tuple) -> dict:
    """The matrix entry's metrics values with the chart's defaults ({} when metrics are off)."""
    chart = yaml.safe_load((CHART / "values.yaml").read_text())["metrics"]
    given = matrix_values(*entry).get("metrics") or {}
    if not given.get("enabled"):
        return {}
    return {**chart, **given, "dashboard": {**chart["dashboard"], **given.get("dashboard", {})}}


def _nproc(objects: dict) -> int:
    return read_deployment(config_files(objects)["deployment.yaml"]).nproc


def test_some_matrix_entries_turn_metrics_on_for_every_launcher():
    on = [entry for entry in MATRIX if _metrics(entry)]
    assert {entry[0] for entry in on} == set(LAUNCHERS) and len(on) < len(MATRIX)


def test_with_metrics_on_each_local_rank_serves_a_named_port_that_the_podmonitor_scrapes(rendered):
    checked = 0
    for entry, outputs in rendered.items():
        metrics = _metrics(entry)
        for source, objects in outputs.items():
            where = f"{entry_id(entry)} {source}"
            monitors = [o for (kind, _), o in objects.items() if kind == "PodMonitor"]
            flags = read_deployment(config_files(objects)["deployment.yaml"]).train_flags
            training, others = _pods(objects)
            if not metrics:
                assert not monitors and "--metrics-port" not in flags, where
                assert not any(p["name"].startswith("metrics-") for t in training for p in _ports(t)), where
                continue
            first, ranks = metrics["port"], _nproc(objects)
            assert flags[flags.index("--metrics-port") + 1] == str(first), where
            (monitor,) = monitors
            assert not k8s_checks.crd_problems(monitor), where
            assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack", where
            selector = monitor["spec"]["selector"]["matchLabels"]
            assert all(_selects(selector, t) for t in training), where
            assert not any(_selects(selector, t) for t in others + [_another_release(t) for t in training]), where
            assert "namespaceSelector" not in monitor["spec"], where  # the PodMonitor's own namespace
            names = [f"metrics-{i}" for i in range(ranks)]
            assert monitor["spec"]["podMetricsEndpoints"] == [
                {"port": name, "path": "/metrics", "interval": "30s"} for name in names
            ], where
            if entry[0] != "trainjob":  # a TrainJob's runtime owns the container's ports (docs/metrics.md)
                for template in training:
                    declared = {p["name"]: p["containerPort"] for p in _ports(template)}
                    assert {n: declared.get(n) for n in names} == {n: first + i for i, n in enumerate(names)}, where
            checked += 1
    assert checked >= 20


def _ports(template: dict) -> list[dict]:
    return [p for c in template["spec"].get("containers", []) for p in c.get("ports", [])]


def test_the_podmonitor_crd_check_catches_a_misspelt_field_a_bad_interval_and_a_wrong_type(rendered):
    monitor = next(o for o in unique_objects(rendered) if o["kind"] == "PodMonitor")
    assert not k8s_checks.crd_problems(monitor)
    bad = json.loads(json.dumps(monitor))
    bad["spec"]["podMetricsEndpoints"][0]["intervall"] = "30s"
    bad["spec"]["podMetricsEndpoints"][1]["interval"] = "30 seconds"
    bad["spec"]["podMetricsEndpoints"][1]["portNumber"] = "9400"
    problems = k8s_checks.crd_problems(bad)
    assert any("intervall" in p for p in problems), problems
    assert any("30 seconds" in p for p in problems), problems
    assert any("portNumber" in p and "'9400' is not of type 'integer'" in p for p in problems), problems


def test_the_dashboard_config_map_holds_files_dashboard_json_unchanged_for_grafanas_sidecar(rendered):
    dashboard = (CHART / "files" / "dashboard.json").read_text()
    seen = 0
    for entry, outputs in rendered.items():
        for source, objects in outputs.items():
            config = objects.get(("ConfigMap", f"{RELEASE}-imagenet-train-dashboard"))
            if config is None:
                continue
            assert config["metadata"]["labels"]["grafana_dashboard"] == "1", f"{entry_id(entry)} {source}"
            assert config["data"] == {"imagenet-train.json": dashboard}, f"{entry_id(entry)} {source}"
            json.loads(config["data"]["imagenet-train.json"])
            seen += 1
    assert seen >= 20


def test_with_metrics_on_the_network_policy_admits_only_prometheus_and_only_on_the_metrics_ports(rendered):
    for entry, outputs in rendered.items():
        metrics = _metrics(entry)
        if not metrics:
            continue
        for source, objects in outputs.items():
            where = f"{entry_id(entry)} {source}"
            policy = objects[("NetworkPolicy", f"{RELEASE}-imagenet-train-trainer")]
            scraper = policy["spec"]["ingress"][1]
            assert scraper["from"] == [
                {
                    "namespaceSelector": {"matchLabels": {}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
                }
            ], where
            first, last = metrics["port"], metrics["port"] + _nproc(objects) - 1
            assert scraper["ports"] == [{"port": first, "endPort": last, "protocol": "TCP"}], where
            assert not first <= 29500 <= last, where  # launcher.port (the c10d store) stays shut to the scraper


def test_metrics_are_off_by_default_and_a_values_file_turns_them_on_in_helm_4_helm_3_and_render_py(tmp_path):
    on = tmp_path / "on.yaml"
    on.write_text(
        yaml.safe_dump(
            {
                "metrics": {
                    "enabled": True,
                    "port": 9100,
                    "podMonitor": {"labels": {"release": "prom"}, "interval": "15s"},
                    "scraper": {"namespaceSelector": {"kubernetes.io/metadata.name": "monitoring"}},
                },
                "launcher": {"nprocPerNode": 2},
                "resources": {"limits": {"nvidia.com/gpu": None}},
            }
        )
    )
    off = tmp_path / "off.yaml"
    off.write_text("{}\n")
    for path in (off, on):
        renders = {"render.py": parse(render([str(path)], release=RELEASE))}
        for helm in ("helm", "helm3"):
            result = helm_template(tool(helm), path, KUBE_VERSIONS[1])
            assert result.returncode == 0, result.stderr
            renders[helm] = parse(result.stdout)
        for source, objects in renders.items():
            kinds = {kind for kind, _ in objects}
            flags = read_deployment(config_files(objects)["deployment.yaml"]).train_flags
            if path == off:
                assert "PodMonitor" not in kinds and "--metrics-port" not in flags, source
                continue
            monitor = objects[("PodMonitor", f"{RELEASE}-imagenet-train")]
            assert monitor["metadata"]["labels"]["release"] == "prom", source
            assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics-0", "metrics-1"], source
            assert {e["interval"] for e in monitor["spec"]["podMetricsEndpoints"]} == {"15s"}, source
            assert flags[flags.index("--metrics-port") + 1] == "9100", source
            policy = objects[("NetworkPolicy", f"{RELEASE}-imagenet-train-trainer")]
            peer = policy["spec"]["ingress"][1]["from"][0]
            assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}, source
            assert policy["spec"]["ingress"][1]["ports"] == [{"port": 9100, "endPort": 9101, "protocol": "TCP"}]
