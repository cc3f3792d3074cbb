"""The harness creates custom resources as a real API server with the operators installed would: a TrainJob,
JobSet or PyTorchJob the CRD's CEL rules or the operator's webhook refuse fails at creation, in their words."""

from __future__ import annotations

import copy

import pytest
from chart_matrix import render_values

from .controllers import Denied
from .release import controller_for

REFUSED_MANAGER = (
    'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: spec.runtimePatches.manager: '
    'Invalid value: "imagenet-train": must be a domain-prefixed path (such as "acme.io/foo")'
)


def workload(kind: str) -> dict:
    objects = render_values({"launcher": {"kind": kind, "nodes": 2}}, release="r")
    return next(o for o in objects.values() if o["kind"] in ("TrainJob", "JobSet", "PyTorchJob"))


@pytest.mark.parametrize("kind", ["trainjob", "jobset", "pytorchjob"])
def test_the_harness_admits_the_rendered_workloads(kind):
    controller = controller_for(None, workload(kind))
    assert controller.name == "r-imagenet-train"


def test_the_harness_refuses_a_trainjob_whose_manager_has_no_domain():
    job = copy.deepcopy(workload("trainjob"))
    job["spec"]["runtimePatches"][0]["manager"] = "imagenet-train"
    with pytest.raises(Denied) as refused:
        controller_for(None, job)
    assert str(refused.value) == REFUSED_MANAGER


def test_the_harness_refuses_a_jobset_whose_pod_names_pass_63_characters():
    jobset = copy.deepcopy(workload("jobset"))
    jobset["metadata"]["name"] = "a" * 52
    with pytest.raises(Denied, match=r'"vjobset.kb.io" denied the request: .*pod names generated for this JobSet'):
        controller_for(None, jobset)


def test_the_harness_refuses_a_pytorchjob_with_two_masters():
    job = copy.deepcopy(workload("pytorchjob"))
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    with pytest.raises(Denied, match=r"spec.pytorchReplicaSpecs\[Master\].replicas: Forbidden: must be 1"):
        controller_for(None, job)
