"""One create or update of a custom resource, in the API server's order, with the operators' webhooks.

kube-apiserver: decode and apply the CRD's defaults; mutating webhooks (then defaults again); the schema
(strict: kubectl and helm ask for fieldValidation=Strict); the CRD's CEL rules; validating webhooks. Each
refusal is one line in the API server's words, naming who refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import k8s_checks

from . import aistore, cel, jobset, trainer, training_operator

GROUPS = {
    "PyTorchJob": "kubeflow.org",
    "TrainJob": "trainer.kubeflow.org",
    "TrainingRuntime": "trainer.kubeflow.org",
    "ClusterTrainingRuntime": "trainer.kubeflow.org",
    "JobSet": "jobset.x-k8s.io",
    "AIStore": "ais.nvidia.com",
}
WEBHOOKS = {
    "TrainJob": "validator.trainjob.trainer.kubeflow.org",
    "TrainingRuntime": "validator.trainingruntime.trainer.kubeflow.org",
    "ClusterTrainingRuntime": "validator.clustertrainingruntime.trainer.kubeflow.org",
    "JobSet": "vjobset.kb.io",
    "PyTorchJob": "validator.pytorchjob.training-operator.kubeflow.org",
    "AIStore": "vaistore.kb.io",
}


@dataclass
class Admission:
    """What the API server stores (the defaulted object) or why it refuses; which CEL rules ran."""

    obj: dict
    problems: list[str] = field(default_factory=list)
    ran: dict = field(default_factory=dict)


def mutate(obj: dict, old: dict | None = None) -> dict:
    """The CRD's defaults, then the operator's defaulting webhook, then the defaults again."""
    kind = obj["kind"]
    schema = cel.crd_schema(kind)
    obj = cel.with_defaults(schema, obj)
    if kind == "JobSet":
        obj = jobset.default(obj)
    elif kind == "TrainJob":
        obj = trainer.default_trainjob(obj, old)
    return cel.with_defaults(schema, obj)


def webhook_problems(obj: dict, old: dict | None = None, runtimes: dict | None = None) -> list[str]:
    """The validating webhook's refusals of a defaulted object (an update of `old` when given)."""
    kind = obj["kind"]
    if kind == "TrainJob":
        return trainer.trainjob_problems(obj, old, runtimes)
    if kind == "JobSet":
        return jobset.update_problems(old, obj) if old is not None else jobset.create_problems(obj)
    if kind == "PyTorchJob":
        return training_operator.pytorchjob_problems(obj)
    if kind == "AIStore":
        return aistore.aistore_problems(obj)
    if kind == "ClusterTrainingRuntime" or (kind == "TrainingRuntime" and old is None):
        return trainer.runtime_problems(obj)
    return []


def admit(obj: dict, old: dict | None = None, runtimes: dict | None = None) -> Admission:
    """Create `obj` (update `old` to it when given) as the API server with the operators installed would."""
    kind = obj["kind"]
    if kind not in GROUPS:
        return Admission(obj)
    name = obj["metadata"]["name"]
    stored_old = mutate(old) if old is not None else None
    new = mutate(obj, stored_old)
    invalid = f'{kind}.{GROUPS[kind]} "{name}" is invalid: '
    problems = [invalid + p for p in k8s_checks.crd_problems(new)]
    evaluation = cel.evaluate(new, stored_old)
    problems += [invalid + p for p in evaluation.problems]
    denied = f'admission webhook "{WEBHOOKS[kind]}" denied the request: '
    problems += [denied + p for p in webhook_problems(new, stored_old, runtimes)]
    return Admission(new, problems, dict(evaluation.ran))
