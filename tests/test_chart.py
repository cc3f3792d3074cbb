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

from imagenet_train.manifests import render

ROOT = Path(__file__).resolve().parents[1]
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
LAUNCHERS = ["pytorchjob", "indexedjob", "trainjob", "jobset"]
SERVERS = ["nginx", "aistore", "bucket"]
RELEASE = "imagenet"


def tool(name: str) -> str:
    path = TOOLS / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make k8s-tools` (make test does)")
    return str(path)


def matrix_values(launcher: str, server: str, nodes: int, elastic: bool) -> dict:
    """One matrix entry; the entries also vary GPUs, fills, deploys and credentials so each path renders."""
    values: dict = {
        "launcher": {"kind": launcher, "nodes": nodes, "gpusPerNode": 0 if nodes == 1 else 8},
        "shards": {"server": server},
    }
    if nodes == 1:
        values["launcher"]["nprocPerNode"] = 2
    if elastic:
        values["launcher"]["elastic"] = {"enabled": True, "minNodes": 1, "maxNodes": max(2, nodes), "maxRestarts": 2}
    if server == "bucket":
        values["shards"]["bucket"] = {"url": "gs://acme-data/imagenet/shards"}
        values["gcp"] = {"credentialsSecret": "gcp-key"}
    if server == "aistore":
        values["shards"]["aistore"] = {"deploy": True} if nodes > 1 else {"endpoint": "http://ais-proxy.ais.svc:51080"}
    if server == "nginx" and nodes == 4:
        values["shards"]["nginx"] = {"fill": {"enabled": True, "from": "gs://acme-data/imagenet/shards"}}
        values["results"] = {"bucket": "gs://acme-runs/imagenet"}
        values["cache"] = {"enabled": True}
    return values


MATRIX = [
    (launcher, server, nodes, elastic)
    for launcher, server, nodes, elastic in itertools.product(LAUNCHERS, SERVERS, [1, 2, 4], [False, True])
    if not (launcher == "trainjob" and elastic)  # a negative case below
]


def entry_id(entry) -> str:
    launcher, server, nodes, elastic = entry
    return f"{launcher}-{server}-{nodes}n{'-elastic' if elastic else ''}"


def parse(stream: str) -> dict[tuple[str, str], dict]:
    objects = {}
    for document in yaml.safe_load_all(stream):
        if document:
            key = (document["kind"], document["metadata"]["name"])
            assert key not in objects, f"{key} rendered twice"
            objects[key] = document
    return objects


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
        out[entry]["render.py"] = parse(render([str(files[entry])], release=RELEASE))
    return out


def test_matrix_covers_every_launcher_server_size_and_elastic_choice():
    assert len(MATRIX) == 63
    assert {e[0] for e in MATRIX} == set(LAUNCHERS) and {e[1] for e in MATRIX} == set(SERVERS)


@pytest.mark.parametrize("entry", MATRIX, ids=entry_id)
def test_helm_and_render_py_produce_identical_objects(rendered, entry):
    outputs = rendered[entry]
    reference = outputs["helm-1.35.0"]
    for source, objects in outputs.items():
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
    core = [o for o in unique_objects(rendered) if (o["apiVersion"], o["kind"]) not in k8s_checks.CRD_FILES]
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
    }
    print(f"kubernetes-validate --strict: {len(core)} distinct core objects x {len(VALIDATE_VERSIONS)} versions")


def test_custom_resources_match_their_published_crds_strictly(rendered):
    custom = [o for o in unique_objects(rendered) if (o["apiVersion"], o["kind"]) in k8s_checks.CRD_FILES]
    problems = [p for obj in custom for p in k8s_checks.crd_problems(obj)]
    assert not problems, "\n".join(problems[:20])
    assert {o["kind"] for o in custom} == {"PyTorchJob", "TrainJob", "JobSet", "AIStore"}
    print(f"CRD schemas: {len(custom)} distinct custom resources")


def test_the_strict_crd_check_catches_a_misspelt_field(rendered):
    job = next(o for o in unique_objects(rendered) if o["kind"] == "PyTorchJob")
    bad = json.loads(json.dumps(job))
    bad["spec"]["runPolicy"]["backofLimit"] = 3
    assert any("backofLimit" in p for p in k8s_checks.crd_problems(bad))


def test_pytorchjobs_pass_the_operator_webhook_rules(rendered):
    jobs = [o for o in unique_objects(rendered) if o["kind"] == "PyTorchJob"]
    problems = [p for job in jobs for p in k8s_checks.pytorchjob_webhook_problems(job)]
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


def test_training_command_and_environment_per_launcher(rendered):
    def container(launcher, server="nginx", nodes=2, elastic=False):
        objects = rendered[(launcher, server, nodes, elastic)]["render.py"]
        obj = next(
            o
            for o in objects.values()
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "trainer"
            and o["kind"] != "Service"
        )
        if launcher == "trainjob":
            return obj["spec"]["trainer"]
        return next(iter(k8s_checks.pod_templates(obj)))["spec"]["containers"][0]

    job = container("indexedjob")
    env = {e["name"]: e["value"] for e in job["env"]}
    assert env["MASTER_ADDR"] == f"{RELEASE}-imagenet-train-0.{RELEASE}-imagenet-train" and env["NNODES"] == "2"
    assert job["args"][:7] == [
        "launch",
        "--nproc-per-node",
        "8",
        "--wait-for",
        f"http://{RELEASE}-imagenet-train-shards/shards.json",
        "--wait-timeout",
        "1800",
    ]
    jobset = {e["name"]: e["value"] for e in container("jobset", nodes=4, elastic=True)["env"]}
    assert jobset["MASTER_ADDR"] == f"{RELEASE}-imagenet-train-node-0-0.{RELEASE}-imagenet-train"
    assert jobset["PET_NNODES"] == "1:4" and jobset["PET_RDZV_ENDPOINT"].endswith(":29500")
    bucket = container("pytorchjob", "bucket")
    assert "--wait-for" not in bucket["args"]
    assert bucket["args"][bucket["args"].index("--shards") + 1] == "gs://acme-data/imagenet/shards/shards.json"
    ais = container("trainjob", "aistore")
    assert {"name": "AIS_ENDPOINT", "value": f"http://{RELEASE}-imagenet-train-ais-proxy:51080"} in ais["env"]
    assert ais["args"][ais["args"].index("--shards") + 1] == "ais://imagenet/shards.json"
    cpu = container("pytorchjob", nodes=1)
    assert cpu["args"][2] == "2" and "nvidia.com/gpu" not in cpu["resources"].get("limits", {})
    assert container("pytorchjob")["resources"]["limits"]["nvidia.com/gpu"] == 8


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
    ({"launcher": {"nodez": 2}}, "nodez"),
    ({"train": {"mode": "exact"}}, "train.mode"),
    ({"shards": {"server": "s3"}}, "shards.server"),
    ({"shards": {"server": "bucket"}}, "shards.bucket.url"),
    ({"shards": {"server": "aistore"}}, "shards.aistore.endpoint"),
    ({"shards": {"nginx": {"fill": {"enabled": True}}}}, "from"),
    ({"results": {"bucket": "s3://runs"}}, "results.bucket"),
    ({"resources": {"limits": {"memory": "lots"}}}, "resources.limits.memory"),
    ({"image": {"repository": ""}}, "image.repository"),
    ({"launcher": {"gpusPerNode": 8, "nprocPerNode": 3}}, "launcher.nprocPerNode: 3 processes cannot each own"),
    (
        {"launcher": {"nodes": 3}, "train": {"globalBatchSize": 1000}},
        "train.globalBatchSize: 1000 does not divide over 3 nodes x 8 processes = 24 GPUs",
    ),
    (
        {"launcher": {"kind": "trainjob", "elastic": {"enabled": True}}},
        "launcher.elastic.enabled: trainjob has no elastic policy",
    ),
    (
        {"launcher": {"nodes": 3, "elastic": {"enabled": True, "maxNodes": 2}}},
        "launcher.elastic: nodes=3 must lie between minNodes=1 and maxNodes=2",
    ),
    ({"launcher": {"kind": "jobset", "restartPolicy": "ExitCode"}}, "ExitCode is a PyTorchJob policy"),
    ({"launcher": {"kind": "trainjob"}, "priorityClassName": "high"}, "priorityClassName: trainjob cannot"),
    ({"shards": {"nginx": {"replicas": 3}}}, "shards.nginx.replicas: 3 servers cannot share a ReadWriteOnce volume"),
]


@pytest.mark.parametrize("values,message", NEGATIVE, ids=[m.split(":")[0][:40] for _, m in NEGATIVE])
def test_bad_values_fail_in_helm_and_render_py_naming_the_field(tmp_path, values, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    for helm in (tool("helm"), tool("helm3")):
        result = helm_template(helm, path, KUBE_VERSIONS[1])
        assert result.returncode != 0 and result.stdout == "", f"{helm} accepted {values}"
        field = message.split(":")[0].split()[0]
        assert field.split(".")[-1] in result.stderr, f"{helm}: {result.stderr}"
    script = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "render.py"), "-f", str(path)], capture_output=True, text=True
    )
    assert script.returncode == 2 and script.stdout == ""
    assert script.stderr.startswith("render.py: error: ") and script.stderr.count("\n") == 1
    assert message in script.stderr or message.split(":")[0] in script.stderr, script.stderr


def test_cross_field_rules_give_the_same_message_in_helm_and_render_py(tmp_path):
    for values, message in NEGATIVE[-7:]:
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(values))
        result = helm_template(tool("helm"), path, KUBE_VERSIONS[1])
        assert message in result.stderr, result.stderr


def test_render_py_set_and_files_merge_like_helm(tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("launcher: {nodes: 4, gpusPerNode: 4}\ntrain: {extraArgs: [--lr, '0.4']}\nnodeSelector: {a: b}\n")
    second.write_text("launcher: {nodes: 2}\nnodeSelector: null\n")
    sets = [
        "train.epochs=10,train.runName=exp-1",
        "tolerations[0].key=gpu",
        "tolerations[0].operator=Exists",
        "train.extraArgs={--label-smoothing,0.2}",
    ]
    args = [a for s in sets for a in ("--set", s)]
    helm = subprocess.run(
        [tool("helm"), "template", RELEASE, str(CHART), "-f", str(first), "-f", str(second), *args],
        capture_output=True,
        text=True,
    )
    assert helm.returncode == 0, helm.stderr
    script = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "render.py"),
            "--release",
            RELEASE,
            "-f",
            str(first),
            "-f",
            str(second),
            *args,
        ],
        capture_output=True,
        text=True,
    )
    assert script.returncode == 0, script.stderr
    assert parse(script.stdout) == parse(helm.stdout)
    job = parse(script.stdout)[("PyTorchJob", f"{RELEASE}-imagenet-train")]
    master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert master["tolerations"] == [{"key": "gpu", "operator": "Exists"}] and "nodeSelector" not in master
    assert master["containers"][0]["args"][-2:] == ["--label-smoothing", "0.2"]
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    # Helm types an integer in --set as a number; both refuse it where the schema wants a string.
    typed = ["--set", "train.extraArgs={--seed,7}"]
    helm = subprocess.run([tool("helm"), "template", RELEASE, str(CHART), *typed], capture_output=True, text=True)
    script = subprocess.run([sys.executable, str(ROOT / "tools" / "render.py"), *typed], capture_output=True, text=True)
    assert helm.returncode and script.returncode == 2
    assert "extraArgs/1" in helm.stderr and "train.extraArgs[1]: 7 is not of type 'string'" in script.stderr


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
