"""Checks on rendered Kubernetes objects that no schema validator makes, and strict CRD schemas.

The operators' admission webhooks and the CRDs' CEL rules are in k8s_rules/.

Each function returns a list of problems (empty when fine), so a test can report all of them at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import yaml

# The published CRDs, vendored with their source versions (tests/crds/README.md).
CRDS = Path(__file__).resolve().parent / "crds"
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?(\d+(\.\d*)?|\.\d+))?$")
# Objects whose names become DNS labels: Services, and workloads whose pods get hostnames from them.
LABEL_NAMED = {"Service", "PyTorchJob", "JobSet", "TrainJob", "Job"}
CRD_FILES = {
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets.yaml",
    ("ais.nvidia.com/v1beta1", "AIStore"): "ais.nvidia.com_aistores.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainer.kubeflow.org_trainingruntimes.yaml",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_podmonitors.yaml",
}


def pod_templates(obj: dict) -> Iterator[dict]:
    """Every pod template (metadata + spec) inside a workload object."""
    kind, spec = obj["kind"], obj.get("spec", {})
    if kind in ("Deployment", "Job"):
        yield spec["template"]
    elif kind == "PyTorchJob":
        yield from (replica["template"] for replica in spec["pytorchReplicaSpecs"].values())
    elif kind == "JobSet":
        yield from (job["template"]["spec"]["template"] for job in spec["replicatedJobs"])
    elif kind == "Pod":
        yield {"metadata": obj["metadata"], "spec": spec}
    elif kind == "TrainJob":
        for patch in spec.get("runtimePatches", []):
            for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                yield job["template"]["spec"]["template"]


def name_problems(obj: dict) -> list[str]:
    name, kind = obj["metadata"]["name"], obj["kind"]
    if kind in LABEL_NAMED:
        if not DNS1035.match(name) or len(name) > 63:
            return [f"{kind}/{name}: not a DNS-1035 label"]
        if kind in ("Job", "JobSet") and len(name) + len("-node-0-0") > 63:
            return [f"{kind}/{name}: pod hostnames derived from it exceed 63 characters"]
    elif not DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
        return [f"{kind}/{name}: not a DNS-1123 subdomain"]
    return []


def selector_problems(objects: list[dict]) -> list[str]:
    """Every Service selects at least one pod template, and its named target ports exist there."""
    problems = []
    templates = [t for obj in objects for t in pod_templates(obj)]
    for service in (o for o in objects if o["kind"] == "Service"):
        selector = service["spec"].get("selector", {})
        chosen = [t for t in templates if selector.items() <= t["metadata"].get("labels", {}).items()]
        name = service["metadata"]["name"]
        if not chosen:
            problems.append(f"Service/{name}: selector {selector} matches no pod template")
        for port in service["spec"]["ports"]:
            target = port.get("targetPort")
            if isinstance(target, str):
                named = {p.get("name") for t in chosen for c in t["spec"]["containers"] for p in c.get("ports", [])}
                if target not in named:
                    problems.append(f"Service/{name}: targetPort '{target}' is no container port of its pods")
    for obj in objects:
        if obj["kind"] == "Deployment":
            match = obj["spec"]["selector"]["matchLabels"]
            if not match.items() <= obj["spec"]["template"]["metadata"]["labels"].items():
                problems.append(f"Deployment/{obj['metadata']['name']}: selector does not match its pod labels")
    return problems


def _quantities(node, path: str) -> Iterator[tuple[str, object]]:
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}.{key}"
            if key in ("requests", "limits") and isinstance(value, dict):
                yield from ((f"{here}.{k}", v) for k, v in value.items())
            elif key in ("sizeLimit", "storage", "size") and not isinstance(value, (dict, list)):
                yield here, value
            else:
                yield from _quantities(value, here)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _quantities(item, f"{path}[{i}]")


def quantity_problems(obj: dict) -> list[str]:
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    spec = obj.get("spec", {})
    return [
        f"{where}{path}: '{value}' is not a Kubernetes quantity"
        for path, value in _quantities(spec, "")
        if not QUANTITY.match(str(value))
    ]


def pod_problems(obj: dict) -> list[str]:
    """Mounts name volumes that exist; the restricted Pod Security profile holds; /dev/shm is memory."""
    problems = []
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    for template in pod_templates(obj):
        spec = template["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        pod_security = spec.get("securityContext", {})
        if pod_security.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: pod seccompProfile is not RuntimeDefault")
        for container in spec["containers"]:
            security = container.get("securityContext", {})
            if security.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}/{container['name']}: allowPrivilegeEscalation not false")
            if security.get("capabilities", {}).get("drop") != ["ALL"]:
                problems.append(f"{where}/{container['name']}: capabilities not dropped")
            if not (security.get("runAsNonRoot") or pod_security.get("runAsNonRoot")):
                problems.append(f"{where}/{container['name']}: may run as root")
            if security.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}/{container['name']}: root filesystem writable")
            for mount in container.get("volumeMounts", []):
                if mount["name"] not in volumes:
                    problems.append(f"{where}/{container['name']}: mount {mount['name']} has no volume")
                if (
                    mount.get("mountPath") == "/dev/shm"
                    and volumes.get(mount["name"], {}).get("emptyDir", {}).get("medium") != "Memory"
                ):
                    problems.append(f"{where}: /dev/shm is not memory-backed")
    return problems


def _strict(schema):
    """A CRD schema where unknown fields fail instead of being pruned silently by the API server."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def crd_validator(api_version: str, kind: str):
    """A jsonschema validator for one custom resource version, from the published CRD (strict)."""
    import jsonschema

    crd = yaml.load((CRDS / CRD_FILES[(api_version, kind)]).read_text(), Loader=yaml.CSafeLoader)
    version = api_version.split("/")[1]
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = _strict(served["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def crd_problems(obj: dict) -> list[str]:
    validator = crd_validator(obj["apiVersion"], obj["kind"])
    return [
        f"{obj['kind']}/{obj['metadata']['name']} {'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(obj)
    ]
