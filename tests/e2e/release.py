"""Helm's part: a release's rendered objects applied to the podman cluster and run to an outcome.

`Release.install` renders the chart (tools/render.py's engine; tests/integration/test_chart.py checks `helm template`
gives the same objects), stores the configuration objects, starts the shard server's Deployment and waits
until it is Ready, then runs the fill Job to completion. `Release.train` renders again with the values of one
training run (only the ConfigMap and the training job may differ from what is running: the rest must be
identical, as `helm upgrade` would leave it), runs the training job under its controller until it succeeds,
fails or times out, and deletes its pods. `Release.helm_test` runs the chart's test Pod (`helm test`).
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from .cluster import Cluster, rendered
from .controllers import (
    Controller,
    DeploymentController,
    JobController,
    JobSetController,
    Outcome,
    PyTorchJobController,
    status_config_map,
    trainjob_to_jobset,
)
from .kubelet import PodRequest, Refused

TRAINING_KINDS = ("PyTorchJob", "JobSet", "TrainJob")


class Release:
    """One Helm release on the cluster: its shard server (when nginx) and its training runs."""

    def __init__(self, cluster: Cluster, name: str, workdir: Path, fill_env: list[dict] = ()):
        self.cluster, self.name, self.workdir = cluster, name, workdir
        self.fill_env = list(fill_env)  # the fill pod's extra variables (the harness's: the bucket emulator)
        self.server: DeploymentController | None = None
        self.steady: dict[tuple[str, str], dict] = {}  # objects that stay the same across training runs
        self.runs = 0

    def render(self, values: dict) -> list[dict]:
        self.runs += 1
        path = self.workdir / f"{self.name}-values-{self.runs}.yaml"
        path.write_text(yaml.safe_dump(values))
        return rendered([str(path)], self.name)

    @staticmethod
    def training(document: dict) -> bool:
        kind = document["kind"]
        component = document["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        return kind in TRAINING_KINDS or (kind in ("Job", "Service") and component == "trainer")

    def install(self, values: dict, timeout: float = 600) -> Outcome:
        """Apply everything but the training job; start the shard server and run the fill Job."""
        documents = self.render(values)
        hooks = [d for d in documents if "helm.sh/hook" in d["metadata"].get("annotations", {})]
        steady = [d for d in documents if not self.training(d) and d not in hooks]
        self.steady = {(d["kind"], d["metadata"]["name"]): d for d in steady}
        workloads = self.cluster.apply(steady)
        outcome = Outcome()
        fill = None
        for document in workloads:
            if document["kind"] == "Deployment":
                self.server = DeploymentController(self.cluster, document)
                self.server.start()
            elif document["kind"] == "Job":
                fill = document
            else:
                raise Refused(f"{document['kind']} {document['metadata']['name']}: not a kind the harness plays")
        if self.server:
            self.cluster.wait(self.server.ready, timeout)
            outcome.note(f"Deployment {self.server.name} Ready")
        if fill:
            job = JobController(self.cluster, fill, env=self.fill_env)
            job.start()
            self.cluster.wait(job.reconcile, timeout)
            outcome.events += job.outcome.events
            outcome.exit_codes += job.outcome.exit_codes
            outcome.end(job.outcome.state, f"fill Job: {job.outcome.reason}")
        else:
            outcome.end("Succeeded", "nothing to fill")
        return outcome

    def train(self, values: dict, timeout: float = 900, tick=None) -> tuple[Outcome, Controller]:
        """One training run: render, check the steady objects did not change, run the job to its outcome."""
        documents = self.render(values)
        for document in documents:
            key = (document["kind"], document["metadata"]["name"])
            if key in self.steady and key[0] != "ConfigMap" and document != self.steady[key]:
                raise AssertionError(f"{key[0]} {key[1]} changed between runs: the running one would be stale")
        applied = [d for d in documents if d["kind"] == "ConfigMap" or (d["kind"] == "Service" and self.training(d))]
        assert not self.cluster.apply(applied)
        jobs = [d for d in documents if self.training(d) and d["kind"] != "Service"]
        assert len(jobs) == 1, [d["kind"] for d in jobs]
        controller = controller_for(self.cluster, jobs[0])
        controller.start()
        try:
            self.cluster.wait(controller.reconcile, timeout, tick=lambda: tick(controller) if tick else None)
        finally:
            controller.delete_all()
            for document in documents:
                if document["kind"] == "Service" and self.training(document):
                    self.cluster.remove("Service", document["metadata"]["name"])
        return controller.outcome, controller

    def helm_test(self, values: dict, timeout: float = 300) -> tuple[int, str]:
        """`helm test`: the chart's test hook Pod, run to its end; its exit code and log."""
        documents = self.render(values)
        pod = next(d for d in documents if d["kind"] == "Pod" and "helm.sh/hook" in d["metadata"]["annotations"])
        if pod["metadata"]["annotations"]["helm.sh/hook"] != "test":
            raise Refused(f"Pod {pod['metadata']['name']}: hook {pod['metadata']['annotations']['helm.sh/hook']}")
        request = PodRequest(pod["metadata"]["name"], copy.deepcopy(pod["spec"]), pod["metadata"].get("labels", {}))
        running = self.cluster.kubelet.create(request)
        self.cluster.wait(lambda: running.done, timeout)
        self.cluster.kubelet.delete(running)
        return running.exit_code, running.log

    def uninstall(self) -> None:
        if self.server:
            self.server.delete_all()
        for kind, name in list(self.steady):
            if kind in ("ConfigMap", "Service", "ServiceAccount"):
                self.cluster.remove(kind, name)


def controller_for(cluster: Cluster, document: dict) -> Controller:
    """The controller that runs a rendered training job."""
    kind = document["kind"]
    if kind == "PyTorchJob":
        return PyTorchJobController(cluster, document)
    if kind == "JobSet":
        return JobSetController(cluster, document)
    if kind == "TrainJob":
        gate = cluster.trainer_status if cluster else None  # the TrainJobStatus feature gate, when on
        if gate:
            cluster.apply([status_config_map(document["metadata"]["name"], gate)])
        return JobSetController(cluster, trainjob_to_jobset(document, gate))
    if kind == "Job":
        return JobController(cluster, document)
    raise Refused(f"{kind}: no controller in the harness")
