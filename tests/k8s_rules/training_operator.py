"""Kubeflow Training Operator v1.9's PyTorchJob admission webhook, ported.

Source: https://github.com/kubeflow/training-operator/blob/v1.9.0/pkg/webhooks/pytorch/pytorchjob_webhook.go
(`validatePyTorchJob`, `validateSpec`, `validatePyTorchReplicaSpecs`) and
https://github.com/kubeflow/training-operator/blob/v1.9.0/pkg/common/util/webhooks.go (`ValidateRunPolicy`,
`ValidateRunPolicyUpdate`). Its `ValidateUpdate` takes both objects from the new one (`oldJob := newObj`), so
the managedBy immutability never fires on a real v1.9 update; the port keeps that behaviour. The operator has
no defaulting webhook (its defaults are set in the controller, after admission).
"""

from __future__ import annotations

from .fields import dns1035_label, forbidden, not_supported, required

REPLICAS = "spec.pytorchReplicaSpecs"
MANAGERS = ["kueue.x-k8s.io/multikueue", "kubeflow.org/training-operator"]


def pytorchjob_problems(job: dict) -> list[str]:
    """validatePyTorchJob: name, runPolicy.managedBy, elastic policy, replica specs."""
    problems, name, spec = [], job["metadata"]["name"], job.get("spec") or {}
    errors = dns1035_label(name)
    if errors:
        problems.append(f'metadata.name: Invalid value: "{name}": should match: {",".join(errors)}')
    manager = (spec.get("runPolicy") or {}).get("managedBy")
    if manager is not None and manager not in MANAGERS:
        problems.append(not_supported("spec.runPolicy.managedBy", manager, MANAGERS))
    replicas = spec.get("pytorchReplicaSpecs")
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        if "Worker" not in (replicas or {}):
            problems.append(required(f"{REPLICAS}[Worker]", "must be configured if elastic policy is used"))
        if elastic.get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
            problems.append(forbidden("spec.elasticPolicy.nProcPerNode", "must not be used with spec.nprocPerNode"))
    if replicas is None:
        problems.append(required(REPLICAS, "must be required"))
    for rtype, replica in (replicas or {}).items():
        path = f"{REPLICAS}[{rtype}]"
        containers_path = f"{path}.template.spec.containers"
        if rtype not in ("Master", "Worker"):
            problems.append(not_supported(path, rtype, ["Master", "Worker"]))
        containers = (((replica or {}).get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers:
            problems.append(required(containers_path, "must be specified"))
        for i, container in enumerate(containers):
            if not container.get("image"):
                problems.append(required(f"{containers_path}[{i}].image", "must be required"))
        if "pytorch" not in [c.get("name") for c in containers]:
            problems.append(required(containers_path, "must have at least one container with name pytorch"))
        count = (replica or {}).get("replicas")
        if rtype == "Master" and count != 1:
            problems.append(forbidden(f"{path}.replicas", "must be 1"))
        elif rtype != "Master" and count is not None and count < 1:
            problems.append(forbidden(f"{path}.replicas", "must be at least 1"))
    return problems
