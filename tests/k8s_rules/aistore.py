"""The AIStore operator's validating webhook rules that its CRD schema cannot state, ported.

Source: https://github.com/NVIDIA/ais-k8s/blob/main/operator/api/aistore/v1beta1/aistore_validation.go
(`ValidateSpec`, main as of 2026-11; tests/crds/README.md).
"""

from __future__ import annotations


def aistore_problems(ais: dict) -> list[str]:
    """ValidateSpec: cluster size, one state storage, valid ports."""
    spec, problems = ais["spec"], []
    sizes_given = "size" in spec.get("proxySpec", {}) and "size" in spec.get("targetSpec", {})
    size = spec.get("size")
    if not sizes_given and (size is None or size == 0 or size <= -2):
        problems.append(f"spec.size {size}: should be at least 1 or -1 for autoscaling")
    if size == -1 and not (
        spec.get("proxySpec", {}).get("nodeSelector") and spec.get("targetSpec", {}).get("nodeSelector")
    ):
        problems.append("spec.size -1 (autoscaling) needs proxySpec and targetSpec nodeSelectors")
    state = spec.get("stateStorage")
    if state is not None:
        if sum(mode in state for mode in ("hostPath", "pvc", "emptyDir")) != 1:
            problems.append("spec.stateStorage must define exactly one of hostPath, pvc, or emptyDir")
    elif "stateStorageClass" not in spec and "hostpathPrefix" not in spec:
        problems.append("spec does not define stateStorage (hostPath, pvc or emptyDir)")
    for daemon in ("proxySpec", "targetSpec"):
        for port in ("servicePort", "portPublic", "portIntraControl", "portIntraData"):
            value = spec.get(daemon, {}).get(port)
            if value is not None and not (isinstance(value, int) and 1 <= value <= 65535):
                problems.append(f"spec.{daemon}.{port} {value}: not a valid port number")
    return problems
