"""Kubeflow Trainer v2.3's admission webhooks for TrainJob and (Cluster)TrainingRuntime, ported.

Source (tag v2.3.0, https://github.com/kubeflow/trainer/tree/v2.3.0):
- pkg/webhooks/trainjob_webhook.go: `TrainJobDefaulter.Default` (stamps runtimePatches[].time) and
  `TrainJobValidator.ValidateCreate/ValidateUpdate`, which hand the TrainJob to the referenced runtime's
  `ValidateObjects` (pkg/runtime/core/clustertrainingruntime.go, trainingruntime.go: the runtime must exist),
  which runs the custom validation plugins of that runtime:
  - pkg/runtime/framework/plugins/jobset/jobset.go `JobSet.Validate` and `checkRuntimePatchesImmutability`;
  - pkg/runtime/framework/plugins/torch/torch.go `Torch.Validate` and `validateEnvInjectionTargets`.
- pkg/webhooks/trainingruntime_webhook.go `validateReplicatedJobs` (also clustertrainingruntime_webhook.go).
Not ported: torch.go's torchtune model check (only for `tune run` commands), the MPI/JAX/XGBoost/Flux/Volcano
plugins (their runtimes are not the chart's), and the running-JobSet lookup of an update to a suspended job.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

from .fields import domain_prefixed_path, forbidden, invalid

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
DATASET, MODEL, TRAINER, NODE = "dataset-initializer", "model-initializer", "trainer", "node"
# constants.go TorchRunReservedEnvNames: the torch plugin sets these itself.
TORCH_RESERVED_ENV = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
# The ClusterTrainingRuntime `torch-distributed` as Trainer v2.3 installs it (manifests/base/runtimes/
# torch_distributed.yaml), the fields its validation reads; the e2e harness plays the same runtime.
TORCH_DISTRIBUTED = {
    "mlPolicy": {"numNodes": 1, "torch": {}},
    "template": {
        "spec": {
            "replicatedJobs": [
                {
                    "name": NODE,
                    "template": {
                        "metadata": {"labels": {ANCESTOR_LABEL: TRAINER}},
                        "spec": {
                            "template": {
                                "spec": {
                                    "containers": [
                                        {"name": NODE, "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"}
                                    ]
                                }
                            }
                        },
                    },
                }
            ]
        }
    },
}
RUNTIMES = {("ClusterTrainingRuntime", "torch-distributed"): TORCH_DISTRIBUTED}
PATCHES = "spec.runtimePatches"


def default_trainjob(job: dict, old: dict | None = None, now: str | None = None) -> dict:
    """TrainJobDefaulter.Default: each runtime patch gets the time it was last changed."""
    job = copy.deepcopy(job)
    now = now or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    before = {p.get("manager"): p for p in ((old or {}).get("spec") or {}).get("runtimePatches") or []}
    for patch in (job.get("spec") or {}).get("runtimePatches") or []:
        previous = before.get(patch.get("manager"))
        if previous is not None and old is not None:
            same = {k: v for k, v in previous.items() if k != "time"} == {k: v for k, v in patch.items() if k != "time"}
            patch["time"] = previous.get("time", now) if same else now
        else:
            patch.setdefault("time", now)
    return job


def _jobs(runtime: dict) -> list[dict]:
    return ((runtime.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []


def _pod(job: dict) -> dict:
    return (((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}


def _container_names(runtime: dict) -> dict[str, set[str]]:
    return {
        job["name"]: {c["name"] for c in _pod(job).get("initContainers", []) + _pod(job).get("containers", [])}
        for job in _jobs(runtime)
    }


def _initializer_problems(job: dict, runtime: dict) -> list[str]:
    """jobset.go Validate: a dataset/model initializer needs its job, container and initializer volume mount."""
    problems, names, ref = [], _container_names(runtime), job["spec"].get("runtimeRef")
    initializer = job["spec"].get("initializer") or {}
    for key, step in (("dataset", DATASET), ("model", MODEL)):
        if not initializer.get(key):
            continue
        if step not in names:
            problems.append(
                invalid(
                    "spec.runtimeRef", ref, f"must have {step} job when trainJob is configured with input {key}Config"
                )
            )
        elif step not in names[step]:
            problems.append(
                invalid("spec.runtimeRef", ref, f"must have container with name - {step} in the {step} job")
            )
        else:
            mounts = [
                m["name"]
                for j in _jobs(runtime)
                if j["name"] == step
                for c in _pod(j).get("containers", [])
                if c["name"] == step
                for m in c.get("volumeMounts", [])
            ]
            if "initializer" not in mounts:
                problems.append(
                    invalid(
                        "spec.runtimeRef",
                        ref,
                        f"must have volumeMount with name - initializer in container {step} of the {step} job",
                    )
                )
    return problems


def _patch_problems(job: dict, runtime: dict, old: dict | None) -> list[str]:
    """jobset.go Validate and checkRuntimePatchesImmutability: the runtime patches' own rules."""
    problems, spec, names = [], job["spec"], _container_names(runtime)
    patches = spec.get("runtimePatches") or []
    changed = old is not None and (old["spec"].get("runtimePatches") or []) != patches
    if changed and not (old["spec"].get("suspend") is True or spec.get("suspend") is True):
        problems.append(
            forbidden(
                PATCHES,
                "RuntimePatches can only be modified when the TrainJob is suspended before or after the update",
            )
        )
    for patch in patches:
        problems += domain_prefixed_path(f"{PATCHES}.manager", patch.get("manager", ""))
        template = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")
        for job_patch in (template or {}).get("replicatedJobs") or []:
            name = job_patch.get("name")
            if name not in names:
                problems.append(
                    invalid(
                        PATCHES, "object", "must not have replicated job that doesn't exist in the runtime job template"
                    )
                )
                continue
            pod = _pod(job_patch)
            for c in pod.get("initContainers", []):
                if c["name"] not in names[name]:
                    problems.append(
                        invalid(
                            PATCHES,
                            "object",
                            f"must not have initContainer that doesn't exist in the runtime job {name}",
                        )
                    )
            for c in pod.get("containers", []):
                if c["name"] not in names[name]:
                    problems.append(
                        invalid(
                            PATCHES, "object", f"must not have container that doesn't exist in the runtime job {name}"
                        )
                    )
                elif c.get("env") and c["name"] in (DATASET, MODEL, NODE):
                    problems.append(
                        invalid(PATCHES, "object", f"must not have envs for the {DATASET}, {MODEL}, {NODE} containers")
                    )
    return problems


def _torch_problems(job: dict, runtime: dict) -> list[str]:
    """torch.go Validate: env-injection targets exist in the runtime; the trainer sets no torchrun variable."""
    torch = (runtime.get("mlPolicy") or {}).get("torch")
    if torch is None:
        return []
    problems, names = [], _container_names(runtime)
    for target in (torch.get("envInjection") or {}).get("targets") or []:
        for container in target.get("containerNames") or []:
            if container not in names.get(target.get("jobName"), set()):
                problems.append(
                    invalid(
                        "spec.runtimeRef",
                        target,
                        f'envInjection target podSet "{target.get("jobName")}" container "{container}" '
                        "not found in runtime template",
                    )
                )
    env = ((job["spec"].get("trainer") or {}).get("env")) or []
    reserved = sorted({e["name"] for e in env} & TORCH_RESERVED_ENV)
    if reserved:
        problems.append(
            invalid(
                "spec.trainer.env",
                "array",
                f"must not have reserved envs, invalid envs configured: [{' '.join(reserved)}]",
            )
        )
    return problems


def trainjob_problems(job: dict, old: dict | None = None, runtimes: dict | None = None) -> list[str]:
    """TrainJobValidator: the referenced runtime must exist; then its plugins' rules."""
    ref = job["spec"].get("runtimeRef") or {}
    kind, name = ref.get("kind", "ClusterTrainingRuntime"), ref.get("name", "")
    runtime = (runtimes or RUNTIMES).get((kind, name))
    if runtime is None:
        cluster = kind == "ClusterTrainingRuntime"  # the two runtimes' messages differ as in the source
        noun, path = (
            ("clusterTrainingRuntime", "spec.RuntimeRef") if cluster else ("trainingRuntime", "spec.runtimeRef")
        )
        found = f'{kind.lower()}s.trainer.kubeflow.org "{name}" not found'
        return [invalid(path, ref, f"{found}: specified {noun} must be created before the TrainJob is created")]
    return _initializer_problems(job, runtime) + _patch_problems(job, runtime, old) + _torch_problems(job, runtime)


def runtime_problems(runtime: dict) -> list[str]:
    """validateReplicatedJobs: an ancestor's replicated job runs once and holds the ancestor's container."""
    expected = {TRAINER: NODE, MODEL: MODEL, DATASET: DATASET}
    problems: list[Any] = []
    for i, job in enumerate(_jobs(runtime.get("spec", runtime))):
        ancestor = (((job.get("template") or {}).get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL)
        if ancestor not in expected:
            continue
        path = f"spec.template.spec.replicatedJobs[{i}]"
        if job.get("replicas", 1) != 1:
            problems.append(invalid(f"{path}.replicas", job.get("replicas"), "always must be 1"))
        if expected[ancestor] not in {c["name"] for c in _pod(job).get("containers", [])}:
            problems.append(
                invalid(
                    f"{path}.template.spec.template.spec.containers",
                    "array",
                    f"must contain the required container for the ancestor: {ancestor}",
                )
            )
    return problems
