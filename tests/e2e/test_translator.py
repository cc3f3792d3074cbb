"""The podman translator (kubelet.py) alone, without podman: every pod the chart renders for each launcher
translates, and a field it does not understand fails instead of being skipped."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from . import cluster as harness
from . import kubelet
from .cluster import rendered
from .controllers import (
    JobSetController,
    PyTorchJobController,
    StatusGate,
    status_audience,
    status_config_map,
    trainjob_to_jobset,
)
from .kubelet import Kubelet, PodRequest, Refused
from .runs import values


class Engine:
    """Stands in for podman: every image exists, every volume is a directory under `root`."""

    def __init__(self, root: Path):
        self.root = root

    def exists(self, image: str) -> bool:
        return True

    def __call__(self, *args: str, check: bool = True, timeout: float = 0) -> subprocess.CompletedProcess:
        out = str(self.root) if args[:2] == ("volume", "inspect") else ""
        return subprocess.CompletedProcess(args, 0, out, "")


class Cluster:
    prefix, network, owned = "test", "test-net", ["--label", "imagenet-train-e2e.owner=1"]

    def __init__(self, root: Path, objects: list[dict]):
        self.root, self.engine = root, Engine(root)
        self.objects = {(o["kind"], o["metadata"]["name"]): o for o in objects}

    def object(self, kind: str, name: str) -> dict:
        if (kind, name) not in self.objects:
            raise Refused(f"{kind} {name}: not rendered")
        return self.objects[(kind, name)]

    def claim(self, name: str) -> str:
        self.object("PersistentVolumeClaim", name)
        return f"{self.prefix}-{name}"

    def hosts(self) -> dict:
        return {}

    def publish(self, name: str, hostname: str) -> str:
        return "10.0.0.2"

    def subdomain(self, *args) -> None:
        pass

    def service_account_token(self, audience: str) -> str:
        return f"token-for-{audience}"


def pods(kind: str, tmp_path: Path, **extra: dict) -> tuple[Cluster, list[PodRequest]]:
    """Every pod the release renders for `kind` (with `extra` top-level values), as its controller would create it
    (affinity left out: the fill pod's needs a running shard server)."""
    path = tmp_path / "values.yaml"
    release = values(kind, "nginx", "r", "http://10.0.0.1:1", epochs=1, elastic=False)
    path.write_text(yaml.safe_dump({**release, **extra}))
    objects = rendered([str(path)], "t")
    cluster = Cluster(tmp_path, objects)
    requests = []
    for document in objects:
        if document["kind"] in ("Deployment", "Job"):
            requests.append(PodRequest("p", document["spec"]["template"]["spec"]))
        elif document["kind"] == "Pod":
            requests.append(PodRequest("p", document["spec"]))
        elif document["kind"] == "PyTorchJob":
            controller = PyTorchJobController(cluster, document)
            requests += [controller.request(r, i, n) for r, i, n in controller.names()]
        elif document["kind"] in ("JobSet", "TrainJob"):
            jobset = trainjob_to_jobset(document) if document["kind"] == "TrainJob" else document
            controller = JobSetController(cluster, jobset)
            controller.start()
            requests += [job.request(0) for job in controller.jobs]
    for request in requests:
        request.spec = {k: v for k, v in request.spec.items() if k != "affinity"}
    return cluster, requests


@pytest.fixture(autouse=True)
def no_chown(monkeypatch):
    """The kubelet's fsGroup ownership change needs root; the translation itself does not."""
    monkeypatch.setattr(kubelet, "own", lambda path, group: None)


@pytest.mark.parametrize("kind", ["pytorchjob", "indexedjob", "jobset", "trainjob"])
def test_every_rendered_pod_translates_with_the_restricted_security_context(kind, tmp_path):
    cluster, requests = pods(kind, tmp_path)
    assert len(requests) >= 4  # nginx, fill, helm test, training
    translator = Kubelet(cluster)
    for request in requests:
        args, _, policy, grace = translator.translate(request, "10.0.0.9", tmp_path / "pod")
        line = " ".join(args)
        assert "--read-only --read-only-tmpfs=false" in line and "--cap-drop ALL" in line, line
        assert "no-new-privileges" in line and "seccomp=" in line, line
        assert "--user 10001:10001" in line or "--user 101:101" in line, line
        assert policy in ("Always", "OnFailure", "Never") and grace > 0


def test_a_field_the_translator_does_not_understand_fails(tmp_path):
    cluster, requests = pods("indexedjob", tmp_path)
    training = next(r.spec for r in requests if r.spec["containers"][0]["name"] == "pytorch")
    translator = Kubelet(cluster)
    with pytest.raises(Refused, match=r"spec\.hostIPC: not understood"):
        translator.translate(PodRequest("p", {**training, "hostIPC": True}), "10.0.0.9", tmp_path / "a")
    gpu = yaml.safe_load(yaml.safe_dump(training))
    gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 8
    with pytest.raises(Refused, match=r"resources\.limits\.nvidia\.com/gpu"):
        translator.translate(PodRequest("p", gpu), "10.0.0.9", tmp_path / "b")
    secret = yaml.safe_load(yaml.safe_dump(training))
    secret["volumes"].append({"name": "key", "secret": {"secretName": "gcp"}})
    with pytest.raises(Refused, match=r"volumes\[key\]\.secret"):
        translator.translate(PodRequest("p", secret), "10.0.0.9", tmp_path / "c")


def test_the_trainers_status_variables_and_volume_sit_beside_the_charts_own(tmp_path):
    """The TrainJobStatus plugin's additions to the chart's TrainJob pod: nothing of the chart's is replaced,
    and the pod still translates under the restricted security context."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values("trainjob", "nginx", "r", "http://10.0.0.1:1", epochs=1)))
    objects = rendered([str(path)], "t")
    trainjob = next(o for o in objects if o["kind"] == "TrainJob")
    name, gate = trainjob["metadata"]["name"], StatusGate("https://10.0.0.1:8443", "-----BEGIN CERTIFICATE-----\n")
    cluster = Cluster(tmp_path, [*objects, status_config_map(name, gate)])
    plain = trainjob_to_jobset(trainjob)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    jobset = trainjob_to_jobset(trainjob, gate)
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["volumes"][:-1] == plain["volumes"]
    container, before = pod["containers"][0], plain["containers"][0]
    assert container["volumeMounts"][:-1] == before["volumeMounts"] and container["env"][:-3] == before["env"]
    controller = JobSetController(cluster, jobset)
    controller.start()
    args, *_ = Kubelet(cluster).translate(controller.jobs[0].request(0), "10.0.0.9", tmp_path / "pod")
    line = " ".join(args)
    url = f"{gate.base_url}/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/{name}/status"
    assert f"--env KUBEFLOW_TRAINER_SERVER_URL={url}" in line, line
    assert "--env KUBEFLOW_TRAINER_SERVER_TOKEN=/var/run/secrets/kubeflow/trainer/token" in line
    assert "--read-only --read-only-tmpfs=false" in line and "--user 10001:10001" in line
    mounted = tmp_path / "pod" / "volumes" / "kubeflow-trainer-token"
    assert f"{mounted}:/var/run/secrets/kubeflow/trainer:ro" in line
    assert (mounted / "token").read_text() == f"token-for-{status_audience('default', name)}"
    assert (mounted / "ca.crt").read_text() == gate.ca_pem


@pytest.mark.parametrize("kind", ["pytorchjob", "jobset"])
def test_a_release_with_metrics_on_stores_its_podmonitor_and_its_pods_with_metrics_ports_translate(kind, tmp_path):
    cluster, requests = pods(kind, tmp_path, metrics={"enabled": True})
    assert ("PodMonitor", "t-imagenet-train") in cluster.objects
    store = type("Store", (), {"objects": {}, "_service": lambda self, document: None})()
    workloads = harness.Cluster.apply(store, list(cluster.objects.values()))
    assert {"PodMonitor", "NetworkPolicy", "ConfigMap"} <= {kind for kind, _ in store.objects}
    assert "PodMonitor" not in {w["kind"] for w in workloads}
    training = [r for r in requests if r.spec["containers"][0]["name"] == "pytorch"]
    assert training and all(
        {"name": "metrics-0", "containerPort": 9400, "protocol": "TCP"} in r.spec["containers"][0]["ports"]
        for r in training
    )
    for request in requests:
        Kubelet(cluster).translate(request, "10.0.0.9", tmp_path / "pod")
