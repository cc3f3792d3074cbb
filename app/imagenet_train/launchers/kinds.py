"""The launcher kinds: one table, KINDS, of every way the training is started, how `launch` recognises each from
its environment (the chart's four also by deployment.yaml's launcher.kind), what runs it, and the torchrun
arguments its environment means. `launch` (launchers/launch.py) and the chart's deployment (deployment.py) read it;
adding a kind is its enum member and its entry (docs/development.md). Pure: no I/O but Slurm's node lookup."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from imagenet_train.errors import ImagenetTrainError, clip

DEFAULT_PORT = "29500"
# torchrun's c10d rendezvous shares its TCPStore with the workers by default (torch >= 2.5). Then an agent that
# was rank 0 keeps the store address of its first round and never publishes it for a later one, so a replaced
# node (a pod restarted after a crash) waits for it until the rendezvous times out, and every node fails
# (pytorch/pytorch#135712, #147064). A store of each round's own keeps an elastic run able to take a node back.
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


class LauncherKind(str, Enum):
    """Every way a run is started (KINDS has each one's entry); the chart's four are its launcher.kind words."""

    SSH = "ssh"
    NGC = "ngc"
    PYTORCHJOB = "pytorchjob"  # Kubeflow Training Operator v1
    INDEXEDJOB = "indexedjob"  # plain batch/v1 Indexed Job, no operator
    TRAINJOB = "trainjob"  # Kubeflow Trainer v2 (its TrainJob becomes a JobSet)
    JOBSET = "jobset"  # the JobSet controller
    SLURM = "slurm"
    NODE_PER_REPLICA = "node-per-replica"  # an operator that sets only MASTER_ADDR/WORLD_SIZE/RANK per node
    STANDALONE = "standalone"
    RENDEZVOUS = "rendezvous"  # `launch --nnodes N --rdzv-endpoint HOST:PORT` on each node, by hand
    RAY = "ray"
    LIGHTNING = "lightning"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class TorchrunLaunch:
    """What `launch` runs on this node: torchrun's own options (before the training module) for a launcher kind."""

    kind: LauncherKind
    torchrun: list[str]
    env: dict[str, str] = field(default_factory=dict)  # set for torchrun and its workers
    elastic: bool = False  # a c10d rendezvous with a node range

    @property
    def label(self) -> str:
        """The kind as `launch` prints it."""
        return f"{self.kind} (elastic)" if self.elastic else str(self.kind)


@dataclass(frozen=True)
class ReservedEnv:
    """Variables a kind's operator sets in the training container, whose admission webhook refuses a workload whose
    env names one: the names, how the refusal begins, and who sets them."""

    names: tuple[str, ...]
    refusal: str
    setter: str


@dataclass(frozen=True)
class ChartLauncher:
    """What the chart's deployment needs of a kind its launcher.kind names.

    master: pod 0's stable hostname from the workload's name, for a kind without an operator that sets torchrun's
    rendezvous (`launch` then reads the deployment's NNODES/MASTER_ADDR); None where the operator sets it.
    jobset_named: JobSet names its pods (a TrainJob becomes a JobSet), and its webhook bounds the name's length.
    reserved_env: what its operator sets in the container and its webhook refuses in the chart's env; None: nothing."""

    master: Callable[[str], str] | None = None
    jobset_named: bool = False
    reserved_env: ReservedEnv | None = None


@dataclass(frozen=True)
class Environment:
    """How `launch` recognises a kind's environment, and the torchrun arguments that environment means."""

    detects: Callable[[Mapping[str, str]], bool]
    resolve: Callable[[Mapping[str, str], str | None], TorchrunLaunch]


@dataclass(frozen=True)
class KindEntry:
    """One launcher kind: what runs it; its environment, for `launch` (None: its own command starts the ranks and
    `launch` never sees it); the chart's part, for a kind its launcher.kind names."""

    runs: str
    environment: Environment | None = None
    chart: ChartLauncher | None = None


def _need(env: Mapping[str, str], name: str, kind: LauncherKind) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ImagenetTrainError(f"launch: {kind} environment without {name}")
    return value


def _int(env: Mapping[str, str], name: str, kind: LauncherKind) -> str:
    value = _need(env, name, kind)
    if not value.isdigit():
        raise ImagenetTrainError(f"launch: {name}='{clip(value)}' is not a whole number")
    return value


def static(nnodes: str, node_rank: str, nproc: str, addr: str, port: str) -> list[str]:
    """torchrun's options for a static rendezvous at `addr:port`."""
    return [
        f"--nnodes={nnodes}",
        f"--node_rank={node_rank}",
        f"--nproc_per_node={nproc}",
        f"--master_addr={addr}",
        f"--master_port={port}",
    ]


def local_devices() -> str:
    """Processes for this node without a launcher's word: one per visible GPU, else 1."""
    try:
        import torch

        return str(max(1, torch.cuda.device_count()))
    except ImportError:
        return "1"


def _ssh(env: Mapping[str, str], nproc: str | None) -> TorchrunLaunch:
    """`imagenet-train ssh` sets IMAGENET_TRAIN_* per host."""
    kind = LauncherKind.SSH
    return TorchrunLaunch(
        kind,
        static(
            _int(env, "IMAGENET_TRAIN_NNODES", kind),
            _int(env, "IMAGENET_TRAIN_NODE_RANK", kind),
            nproc or local_devices(),
            _need(env, "IMAGENET_TRAIN_MASTER_ADDR", kind),
            env.get("IMAGENET_TRAIN_MASTER_PORT", DEFAULT_PORT),
        ),
    )


def _ngc(env: Mapping[str, str], nproc: str | None) -> TorchrunLaunch:
    """NGC batch: one replica per node of an array; the address is needed once there are two."""
    kind = LauncherKind.NGC
    per_node = nproc or _int(env, "NGC_GPUS_PER_NODE", kind)
    index = env.get("NGC_ARRAY_INDEX") or env.get("NGC_REPLICA_ID") or "0"
    addr = env.get("NGC_MASTER_ADDR") or ("localhost" if env["NGC_ARRAY_SIZE"] == "1" else "")
    if not addr:
        raise ImagenetTrainError("launch: NGC multinode environment without NGC_MASTER_ADDR")
    return TorchrunLaunch(
        kind, static(_int(env, "NGC_ARRAY_SIZE", kind), index, per_node, addr, env.get("MASTER_PORT", DEFAULT_PORT))
    )


def _kubeflow(kind: LauncherKind) -> Callable[[Mapping[str, str], str | None], TorchrunLaunch]:
    """Kubeflow PyTorchJob (training-operator) and TrainJob (trainer v2) set torchrun's PET_* variables."""

    def resolve(env: Mapping[str, str], nproc: str | None) -> TorchrunLaunch:
        per_node = nproc or env.get("PET_NPROC_PER_NODE") or "1"
        nnodes = env.get("PET_NNODES", "1")
        if env.get("PET_RDZV_ENDPOINT"):
            args = [
                f"--nnodes={nnodes}",
                f"--nproc_per_node={per_node}",
                f"--rdzv_backend={env.get('PET_RDZV_BACKEND', 'c10d')}",
                f"--rdzv_endpoint={env['PET_RDZV_ENDPOINT']}",
                f"--rdzv_id={env.get('PET_RDZV_ID') or env.get('JOB_NAME') or 'imagenet-train'}",
            ]
            if env.get("PET_MAX_RESTARTS"):
                args.append(f"--max_restarts={env['PET_MAX_RESTARTS']}")
            return TorchrunLaunch(kind, args, dict(ELASTIC_ENV), elastic=True)
        addr = env.get("PET_MASTER_ADDR") or _need(env, "MASTER_ADDR", kind)
        port = env.get("PET_MASTER_PORT") or env.get("MASTER_PORT") or DEFAULT_PORT
        rank = env.get("PET_NODE_RANK") or env.get("RANK") or "0"
        return TorchrunLaunch(kind, static(nnodes, rank, per_node, addr, port))

    return resolve


def _jobset_master(env: Mapping[str, str]) -> str:
    """JobSet pods are <jobset>-<replicatedJob>-<jobIndex>-<podIndex> under the subdomain <jobset>: pod 0's name."""
    jobset, replicated = env["JOBSET_NAME"], env.get("REPLICATED_JOB_NAME", "")
    return f"{jobset}-{replicated}-0-0.{jobset}" if replicated else ""


def _indexed(
    kind: LauncherKind, master: Callable[[Mapping[str, str]], str] = lambda env: ""
) -> Callable[[Mapping[str, str], str | None], TorchrunLaunch]:
    """JobSet and Indexed Job: a pod's completion index is its node rank; pod 0's hostname the address (MASTER_ADDR,
    else what `master` makes of the environment)."""

    def resolve(env: Mapping[str, str], nproc: str | None) -> TorchrunLaunch:
        per_node = nproc or env.get("NPROC_PER_NODE") or "1"
        addr = env.get("MASTER_ADDR") or master(env)
        if not addr:
            raise ImagenetTrainError(f"launch: {kind} environment without MASTER_ADDR (pod 0's hostname)")
        nnodes, index = _int(env, "NNODES", kind), env["JOB_COMPLETION_INDEX"]
        return TorchrunLaunch(kind, static(nnodes, index, per_node, addr, env.get("MASTER_PORT", DEFAULT_PORT)))

    return resolve


def _slurm(env: Mapping[str, str], nproc: str | None) -> TorchrunLaunch:
    """A Slurm task (sbatch/srun): slurm.py reads SLURM_* and looks up the first node."""
    from imagenet_train.launchers.slurm import torchrun_args

    return TorchrunLaunch(LauncherKind.SLURM, torchrun_args(env, nproc, local_devices))


def _node_per_replica(env: Mapping[str, str], nproc: str | None) -> TorchrunLaunch:
    """An operator that sets only MASTER_ADDR/WORLD_SIZE/RANK, one replica per node."""
    per_node = nproc or env.get("NPROC_PER_NODE") or "1"
    kind = LauncherKind.NODE_PER_REPLICA
    nnodes, rank = _int(env, "WORLD_SIZE", kind), env.get("RANK", "0")
    return TorchrunLaunch(
        kind, static(nnodes, rank, per_node, env["MASTER_ADDR"], env.get("MASTER_PORT", DEFAULT_PORT))
    )


def _standalone(env: Mapping[str, str], nproc: str | None) -> TorchrunLaunch:
    """No launcher: plain single-node torchrun over the local GPUs."""
    return TorchrunLaunch(
        LauncherKind.STANDALONE, ["--standalone", "--nnodes=1", f"--nproc_per_node={nproc or local_devices()}"]
    )


def _pet(env: Mapping[str, str]) -> bool:
    return "PET_NNODES" in env or "PET_NPROC_PER_NODE" in env


def _trainjob(env: Mapping[str, str]) -> bool:
    """Trainer v2's torch plugin sets PET_MASTER_ADDR and no MASTER_ADDR; the training-operator sets MASTER_ADDR."""
    return _pet(env) and "PET_MASTER_ADDR" in env and "MASTER_ADDR" not in env


# Kubeflow Trainer v2.3's torch plugin sets these in the trainer container; its webhook refuses a TrainJob whose
# spec.trainer.env names one (pkg/runtime/framework/plugins/torch/torch.go Validate).
TRAINER_RESERVED_ENV = ReservedEnv(
    ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"),
    "the Trainer webhook refuses the TrainJob: spec.trainer.env must not have reserved envs",
    "Kubeflow Trainer",
)

# One entry per LauncherKind. `launch` takes the first whose environment matches, in this order (standalone matches
# any environment); the kinds without one are started by their own command and never reach `launch`.
KINDS: dict[LauncherKind, KindEntry] = {
    LauncherKind.SSH: KindEntry(
        "`imagenet-train ssh`, which sets IMAGENET_TRAIN_* and runs `launch` on each host",
        Environment(lambda env: "IMAGENET_TRAIN_NODE_RANK" in env, _ssh),
    ),
    LauncherKind.NGC: KindEntry(
        "NGC Base Command's batch job (`tools/ngc.py submit`)",
        Environment(lambda env: "NGC_ARRAY_SIZE" in env, _ngc),
    ),
    LauncherKind.TRAINJOB: KindEntry(
        "Kubeflow Trainer v2 (the chart's TrainJob)",
        Environment(_trainjob, _kubeflow(LauncherKind.TRAINJOB)),
        ChartLauncher(jobset_named=True, reserved_env=TRAINER_RESERVED_ENV),
    ),
    LauncherKind.PYTORCHJOB: KindEntry(
        "the Kubeflow Training Operator (the chart's PyTorchJob)",
        Environment(_pet, _kubeflow(LauncherKind.PYTORCHJOB)),
        ChartLauncher(),
    ),
    LauncherKind.JOBSET: KindEntry(
        "the JobSet controller (the chart's JobSet)",
        Environment(
            lambda env: "JOB_COMPLETION_INDEX" in env and "JOBSET_NAME" in env,
            _indexed(LauncherKind.JOBSET, _jobset_master),
        ),
        ChartLauncher(master=lambda name: f"{name}-node-0-0.{name}", jobset_named=True),
    ),
    LauncherKind.INDEXEDJOB: KindEntry(
        "Kubernetes' Job controller (the chart's Indexed Job with its headless Service)",
        Environment(lambda env: "JOB_COMPLETION_INDEX" in env, _indexed(LauncherKind.INDEXEDJOB)),
        ChartLauncher(master=lambda name: f"{name}-0.{name}"),
    ),
    LauncherKind.SLURM: KindEntry(
        "Slurm: `imagenet-train slurm` writes the sbatch script, whose srun runs `launch` on each node",
        Environment(lambda env: "SLURM_JOB_ID" in env and ("SLURM_NODEID" in env or "SLURM_PROCID" in env), _slurm),
    ),
    LauncherKind.NODE_PER_REPLICA: KindEntry(
        "an operator that starts one replica per node and sets MASTER_ADDR, WORLD_SIZE and RANK",
        Environment(
            lambda env: "MASTER_ADDR" in env and "WORLD_SIZE" in env and "LOCAL_RANK" not in env, _node_per_replica
        ),
    ),
    LauncherKind.STANDALONE: KindEntry(
        "`imagenet-train launch` on one machine", Environment(lambda env: True, _standalone)
    ),
    LauncherKind.RENDEZVOUS: KindEntry(
        "`imagenet-train launch --nnodes N --rdzv-endpoint HOST:PORT` on each node (launch.by_hand)"
    ),
    LauncherKind.RAY: KindEntry("`imagenet-train ray`: Ray Train's workers (launchers/ray_train.py)"),
    LauncherKind.LIGHTNING: KindEntry(
        "a Lightning Trainer over ShardDataModule and ImagenetModule (launchers/lightning_module.py)"
    ),
}


def detected(env: Mapping[str, str]) -> tuple[LauncherKind, Environment]:
    """The kind whose environment `env` is, and its entry's environment: the first of KINDS that recognises it."""
    return next(
        (kind, entry.environment)
        for kind, entry in KINDS.items()
        if entry.environment and entry.environment.detects(env)
    )


def chart_launchers() -> dict[LauncherKind, ChartLauncher]:
    """The kinds the chart's launcher.kind may name, with their chart entries, in the table's order."""
    return {kind: entry.chart for kind, entry in KINDS.items() if entry.chart}


def chart_kind(value: object, where: str) -> LauncherKind:
    """A launcher.kind word as its member; one the chart cannot deploy is refused in one line naming `where`."""
    kind = next((kind for kind in chart_launchers() if kind.value == value), None)
    if kind is None:
        known = ", ".join(map(str, chart_launchers()))
        raise ImagenetTrainError(f"{where}: expected one of {known} (the chart's launcher kinds), got '{clip(value)}'")
    return kind
