"""What the chart's pods run, computed from the chart's values instead of in templates.

The chart renders its values into a ConfigMap (`deployment.yaml`: the release's object name plus the
launcher, shards, results, cache, gcp, resources and train sections) and every training pod runs
`imagenet-train launch --deployment deployment.yaml -- train --config train.yaml`. This module turns those
values into torchrun's process count, the environment a launcher kind needs, the shard index to wait for
and the training flags the deployment owns (where the shards are, where results go). It also holds the
cross-field rules that JSON Schema cannot state; launch, tools/render.py and tools/ngc.py all call
`problems`. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import Enum
from typing import Any

from imagenet_train.config import Config
from imagenet_train.config_files import command_line_only, settings_from
from imagenet_train.declarations import flag
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.launchers.kinds import ChartLauncher, chart_kind, chart_launchers


class ShardServer(str, Enum):
    """The chart's shards.server: where the loaders read shards from (values.yaml declares the words)."""

    NGINX = "nginx"  # a Deployment serving a volume over HTTP
    AISTORE = "aistore"  # AIStore's HTTP API
    BUCKET = "bucket"  # the bucket itself, streamed directly

    def __str__(self) -> str:
        return self.value


# Training settings the deployment sets from its other sections; the chart's `train:` schema leaves them out.
OWNED = frozenset(
    {
        "shards",
        "train_urls",
        "val_urls",
        "train_samples",
        "run_dir",
        "results",
        "cache_dir",
        "cache_max_bytes",
        "metrics_port",
    }
)

RESULTS_MOUNT = "/results"
CACHE_MOUNT = "/cache"
GCP_SECRET_MOUNT = "/var/run/secrets/gcp"
SCRATCH_MOUNT = "/tmp"  # the pods' writable scratch (an emptyDir); their root filesystem is read-only

# Where programs in a pod write on their own (HOME for ~/.triton, ~/.config; caches; resumable-upload
# records): under declared volumes, never the read-only root. Upload records sit on the results volume,
# so a checkpoint upload cut off by a pod restart resumes when that volume is a claim.
WRITABLE_ENV = {
    "HOME": SCRATCH_MOUNT,
    "XDG_CACHE_HOME": f"{SCRATCH_MOUNT}/.cache",
    "IMAGENET_TRAIN_UPLOAD_SESSIONS": f"{RESULTS_MOUNT}/.upload-sessions",
}
# The kubelet makes a volume group-writable for the pod's fsGroup each time it mounts it (a restarted pod's claim):
# folders of ours that only the pod's own group may also write to are accepted (io/owned.py). The pod's own
# variables win.
POD_DEFAULTS = {"IMAGENET_TRAIN_TRUST_GROUP": "1"}


@dataclass(frozen=True)
class Deployment:
    """What `launch --deployment` adds to a training pod's command."""

    nproc: int
    wait_for: str  # the shard index to wait for before starting ("" for buckets)
    wait_timeout: float
    env: dict[str, str]
    train_flags: list[str]


def gpus_per_node(values: Mapping[str, Any]) -> int:
    """GPUs each training pod asks for: resources.limits['nvidia.com/gpu'] (0 without)."""
    limits = (values.get("resources") or {}).get("limits") or {}
    return int(limits.get("nvidia.com/gpu", 0) or 0)


def nproc(values: Mapping[str, Any]) -> int:
    """Training processes per node: launcher.nprocPerNode, else one per GPU, else 1."""
    return int(values["launcher"]["nprocPerNode"] or max(1, gpus_per_node(values)))


def run_name(values: Mapping[str, Any], release: str) -> str:
    """The run's name: results.runName, else the release name."""
    return values["results"].get("runName") or release


def shards_url(values: Mapping[str, Any], name: str) -> str:
    """Where the loaders find the shard index: the nginx Service, the AIS bucket, or the bucket prefix."""
    shards = values["shards"]
    if shards["server"] == ShardServer.NGINX:
        return f"http://{name}-shards/{shards['index']}"
    if shards["server"] == ShardServer.AISTORE:
        return f"ais://{shards['aistore']['bucket']}/{shards['index']}"
    return f"{shards['bucket']['url'].rstrip('/')}/{shards['index']}"


def ais_endpoint(values: Mapping[str, Any], name: str) -> str:
    """The AIStore proxy's URL: the one the chart deploys, else the configured endpoint."""
    aistore = values["shards"]["aistore"]
    return f"http://{name}-ais-proxy:51080" if aistore["deploy"] else aistore["endpoint"].rstrip("/")


def chart_launcher(values: Mapping[str, Any], where: str = "launcher.kind") -> ChartLauncher:
    """The launcher table's chart entry for launcher.kind; a kind the chart cannot deploy is refused in one line."""
    launcher = values.get("launcher")
    return chart_launchers()[chart_kind(launcher.get("kind") if isinstance(launcher, Mapping) else None, where)]


def storage_env(values: Mapping[str, Any], name: str) -> dict[str, str]:
    """Endpoints and the credentials' location (never a key) for the shard source and results bucket."""
    env = {}
    if values["shards"]["server"] == ShardServer.AISTORE:
        env["AIS_ENDPOINT"] = ais_endpoint(values, name)
    gcp = values["gcp"]
    if gcp["credentialsSecret"]:
        env["GOOGLE_APPLICATION_CREDENTIALS"] = f"{GCP_SECRET_MOUNT}/{gcp['credentialsKey']}"
    return env


def rendezvous_env(values: Mapping[str, Any], name: str) -> dict[str, str]:
    """What `launch` reads on launchers without an operator that sets it (Indexed Job, JobSet)."""
    launcher, chart = values["launcher"], chart_launcher(values)
    if chart.master is None:  # the operator sets torchrun's rendezvous
        return {}
    master = chart.master(name)
    env = {"NNODES": str(launcher["nodes"]), "MASTER_ADDR": master, "MASTER_PORT": str(launcher["port"])}
    elastic = launcher["elastic"]
    if elastic["enabled"]:
        env |= {
            "PET_NNODES": f"{elastic['minNodes']}:{elastic['maxNodes']}",
            "PET_RDZV_BACKEND": "c10d",
            "PET_RDZV_ENDPOINT": f"{master}:{launcher['port']}",
            "PET_RDZV_ID": name,
            "PET_MAX_RESTARTS": str(elastic["maxRestarts"]),
        }
    return env


# The cache's share of its volume's sizeLimit. The kubelet evicts the pod once the emptyDir's usage (du: allocated
# blocks) passes sizeLimit, and the cache counts apparent sizes of its own files: the rest is headroom for block
# rounding, the lock file, a copy replaced while a reader still holds it (its blocks live until it is closed) and
# anything else written under /cache.
CACHE_SHARE = Decimal("0.9")
_SUFFIXES: dict[str, int | Decimal] = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": Decimal("0.001"),
}
_SUFFIXES |= {f"{prefix}i": 1024 ** (n + 1) for n, prefix in enumerate("KMGTPE")}


def quantity_bytes(quantity: str | int, field: str) -> int:
    """A Kubernetes quantity (500Gi, 64G, 1e9, 1024) as a whole number of bytes; `field` names it in errors."""
    match = re.fullmatch(r"\s*([0-9.eE+-]+?)([kKMGTPEm]i?|)\s*", str(quantity))
    try:
        if not match or match[2] == "mi":
            raise InvalidOperation
        return int(Decimal(match[1]) * _SUFFIXES[match[2]])
    except (InvalidOperation, KeyError):
        raise ImagenetTrainError(f"{field}: {quantity!r} is not a Kubernetes quantity (500Gi, 64G)") from None


def cache_limit(cache: Mapping[str, Any]) -> int:
    """`--cache-max-bytes` for the chart's cache section: its share of the volume's sizeLimit (0: no cache)."""
    if not cache["enabled"]:
        return 0
    return max(1, int(quantity_bytes(cache["sizeLimit"], "cache.sizeLimit") * CACHE_SHARE))  # 0 is no limit


def owned_flags(
    shards: str, run_dir: str, results: str = "", cache_dir: str = "", cache_max_bytes: int = 0, metrics_port: int = 0
) -> list[str]:
    """The training flags a deployment sets: where shards come from, where results go, the cache's limit and the
    metrics' port."""
    flags = ["--shards", shards, "--run-dir", run_dir]
    if results:
        flags += ["--results", results]
    if cache_dir:
        flags += ["--cache-dir", cache_dir]
    if cache_max_bytes:
        flags += ["--cache-max-bytes", str(cache_max_bytes)]
    if metrics_port:
        flags += ["--metrics-port", str(metrics_port)]
    return flags


def metrics_port(values: Mapping[str, Any]) -> int:
    """The port local rank 0 serves metrics on (metrics.port; 0 with metrics off or no metrics section)."""
    metrics = values.get("metrics") or {}
    return int(metrics["port"]) if metrics.get("enabled") else 0


def settings_flags(settings: Mapping[str, Any]) -> list[str]:
    """A mapping of training settings as `train` flags, for launchers that cannot mount a config file."""
    flags = []
    for name, value in settings.items():
        if isinstance(value, bool):
            flags.append(flag(name) if value else "--no-" + name.replace("_", "-"))
        else:
            flags += [flag(name), str(value)]
    return flags


def pod_environment(deployment: Deployment, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment `launch` runs torchrun with: the pod's own variables win, except the writable paths
    (the container runtime always sets HOME, to a directory on the read-only root)."""
    return {**deployment.env, **POD_DEFAULTS, **environ, **WRITABLE_ENV}


def read_deployment(document: Mapping[str, Any]) -> Deployment:
    """The launch plan of a training pod from the chart's deployment.yaml."""
    name, values = document["name"], document
    problem = next(iter(problems(values)), None)
    if problem:
        raise ImagenetTrainError(problem)
    url = shards_url(values, name)
    run = run_name(values, document["release"])
    bucket = values["results"]["bucket"].rstrip("/")
    flags = owned_flags(
        url,
        f"{RESULTS_MOUNT}/{run}",
        results=f"{bucket}/{run}" if bucket else "",
        cache_dir=CACHE_MOUNT if values["cache"]["enabled"] else "",
        cache_max_bytes=cache_limit(values["cache"]),
        metrics_port=metrics_port(values),
    )
    # The operator's `train:` values reach `train` as train.yaml, a file; what only a command line may give
    # (--trust-index, a pipe: URL) comes as flags as well, which train.yaml's values then do not override.
    flags += settings_flags(command_line_only(settings_from(values.get("train") or {}, "train")))
    remote = values["shards"]["server"] != ShardServer.BUCKET
    return Deployment(
        nproc=nproc(values),
        wait_for=url if remote else "",
        wait_timeout=float(values["launcher"]["waitForShardsSeconds"]),
        env=storage_env(values, name) | rendezvous_env(values, name),
        train_flags=flags,
    )


DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def admission_problems(values: Mapping[str, Any], name: str) -> list[str]:
    """What the API server or an operator's admission webhook would refuse in the objects named `name`.

    The workload's name is a DNS-1035 label for every launcher (PyTorchJob webhook, TrainJob CEL rule, JobSet
    webhook, a Service); JobSet's webhook (also on the JobSet a TrainJob becomes) refuses a name whose
    longest pod name, NAME-node-0-INDEX plus a 6-character suffix, passes 63 characters.
    """
    launcher, errors = values["launcher"], []
    where = "fullnameOverride" if values.get("fullnameOverride") else "the release name or fullnameOverride"
    if not DNS1035.fullmatch(name):
        errors.append(
            f"{where}: the workload name {name[:80]!r} is refused by the API server: a DNS-1035 label must consist "
            "of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an "
            "alphanumeric character"
        )
    pod = f"{name}-node-0-{int(launcher['nodes']) - 1}-abcde"
    if chart_launcher(values).jobset_named and len(pod) > 63:
        errors.append(
            f"{where}: the JobSet webhook refuses {name[:80]!r}: JobSet name is too long, pod names generated for "
            f"this JobSet will exceed 63 characters ({len(pod)} in the last pod's)"
        )
    kept = chart_launcher(values).reserved_env
    if kept:
        reserved = sorted({str(e.get("name")) for e in values.get("env") or []} & set(kept.names))
        if reserved:
            errors.append(
                f"env: {kept.refusal}, invalid envs configured: [{' '.join(reserved)}] ({kept.setter} sets them)"
            )
    return errors


def problems(values: Mapping[str, Any], name: str | None = None) -> list[str]:
    """The chart's cross-field rules that JSON Schema cannot state, as one-line messages naming the value.

    With the workload's name (deployment.yaml carries it; render.py passes it) the admission rules too.
    """
    try:
        chart_launcher(values)
    except ImagenetTrainError as error:
        return [str(error)]  # the rules below read the kind
    launcher = values["launcher"]
    errors = []
    name = name or values.get("name")
    if name:
        errors += admission_problems(values, str(name))
    gpus, procs = gpus_per_node(values), int(launcher["nprocPerNode"])
    if gpus and procs and procs != gpus:
        errors.append(
            f"launcher.nprocPerNode: {procs} processes cannot each own one of the {gpus} GPUs in "
            "resources.limits (set 0 for one per GPU)"
        )
    first = metrics_port(values)
    if first and first <= int(launcher["port"]) < first + nproc(values):
        errors.append(
            f"metrics.port: the metrics ports {first}..{first + nproc(values) - 1} take launcher.port "
            f"{launcher['port']} (torchrun's rendezvous); move one of them"
        )
    elastic = launcher["elastic"]
    if elastic["enabled"] and not elastic["minNodes"] <= launcher["nodes"] <= elastic["maxNodes"]:
        errors.append(
            f"launcher.elastic: nodes={launcher['nodes']} must lie between minNodes={elastic['minNodes']} "
            f"and maxNodes={elastic['maxNodes']}"
        )
    try:
        settings = settings_from(values.get("train") or {}, "train")
        owned = sorted(OWNED & set(settings))
        if owned:
            errors.append(f"train.{owned[0]}: set by the chart (shards, results, cache, metrics); remove it from train")
        config = Config()
        config.loader.global_batch_size = settings.get("global_batch_size", 0)
        config.optim.grad_accum_steps = settings.get("grad_accum_steps", 1)
        config.for_world(int(launcher["nodes"]) * nproc(values))
    except ImagenetTrainError as error:
        message = str(error).replace("--global-batch-size", "train.global_batch_size")
        errors.append(message.replace("--grad-accum-steps", "train.grad_accum_steps"))
    return errors
