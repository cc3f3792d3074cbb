"""`imagenet-train launch`: turn whichever launcher's environment this pod/job has into torchrun arguments.

Recognised, first match wins: `imagenet-train ssh` (IMAGENET_TRAIN_NODE_RANK, ...), NGC batch (NGC_ARRAY_*),
Kubeflow PyTorchJob and Trainer v2 TrainJob (PET_*, set by the operators), JobSet and Indexed Job
(JOB_COMPLETION_INDEX), a Slurm task (SLURM_*, see slurm.py), an operator that only sets
MASTER_ADDR/WORLD_SIZE/RANK per node, and plain single-node torchrun.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.launchers.launcher_death import GRACE_VARIABLES
from imagenet_train.launchers.telemetry import telemetry_defaults
from imagenet_train.redact import redact

DEFAULT_PORT = "29500"
# Seconds the ranks get after SIGTERM/SIGUSR1 to finish their step and checkpoint before SIGKILL (a pod's
# terminationGracePeriodSeconds should be a little longer). The default of `launch` and `ssh`.
GRACE_PERIOD = 80
# torchrun's c10d rendezvous shares its TCPStore with the workers by default (torch >= 2.5). Then an agent that
# was rank 0 keeps the store address of its first round and never publishes it for a later one, so a replaced
# node (a pod restarted after a crash) waits for it until the rendezvous times out, and every node fails
# (pytorch/pytorch#135712, #147064). A store of each round's own keeps an elastic run able to take a node back.
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True)
class Launch:
    launcher: str
    torchrun: list[str]  # torchrun's own options, before the training module
    env: dict[str, str] = field(default_factory=dict)  # set for torchrun and its workers


def _need(env: Mapping[str, str], name: str, launcher: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ImagenetTrainError(f"launch: {launcher} environment without {name}")
    return value


def _int(env: Mapping[str, str], name: str, launcher: str) -> str:
    value = _need(env, name, launcher)
    if not value.isdigit():
        raise ImagenetTrainError(f"launch: {name}='{value}' is not a whole number")
    return value


def _static(nnodes: str, node_rank: str, nproc: str, addr: str, port: str) -> list[str]:
    return [
        f"--nnodes={nnodes}",
        f"--node_rank={node_rank}",
        f"--nproc_per_node={nproc}",
        f"--master_addr={addr}",
        f"--master_port={port}",
    ]


def _ssh(env: Mapping[str, str], nproc: str | None) -> Launch:
    """`imagenet-train ssh` sets IMAGENET_TRAIN_* per host."""
    return Launch(
        "ssh",
        _static(
            _int(env, "IMAGENET_TRAIN_NNODES", "ssh"),
            _int(env, "IMAGENET_TRAIN_NODE_RANK", "ssh"),
            nproc or _local_devices(),
            _need(env, "IMAGENET_TRAIN_MASTER_ADDR", "ssh"),
            env.get("IMAGENET_TRAIN_MASTER_PORT", DEFAULT_PORT),
        ),
    )


def _ngc(env: Mapping[str, str], nproc: str | None) -> Launch:
    """NGC batch: one replica per node of an array; the address is needed once there are two."""
    per_node = nproc or _int(env, "NGC_GPUS_PER_NODE", "NGC")
    index = env.get("NGC_ARRAY_INDEX") or env.get("NGC_REPLICA_ID") or "0"
    addr = env.get("NGC_MASTER_ADDR") or ("localhost" if env["NGC_ARRAY_SIZE"] == "1" else "")
    if not addr:
        raise ImagenetTrainError("launch: NGC multinode environment without NGC_MASTER_ADDR")
    return Launch(
        "ngc",
        _static(_int(env, "NGC_ARRAY_SIZE", "NGC"), index, per_node, addr, env.get("MASTER_PORT", DEFAULT_PORT)),
    )


def _kubeflow(env: Mapping[str, str], nproc: str | None) -> Launch:
    """Kubeflow PyTorchJob (training-operator) and TrainJob (trainer v2) set torchrun's PET_* variables."""
    launcher = "trainjob" if "PET_MASTER_ADDR" in env and "MASTER_ADDR" not in env else "pytorchjob"
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
        return Launch(f"{launcher} (elastic)", args, dict(ELASTIC_ENV))
    addr = env.get("PET_MASTER_ADDR") or _need(env, "MASTER_ADDR", launcher)
    port = env.get("PET_MASTER_PORT") or env.get("MASTER_PORT") or DEFAULT_PORT
    rank = env.get("PET_NODE_RANK") or env.get("RANK") or "0"
    return Launch(launcher, _static(nnodes, rank, per_node, addr, port))


def _indexed(env: Mapping[str, str], nproc: str | None) -> Launch:
    """JobSet and Indexed Job: a pod's completion index is its node rank; pod 0's hostname the address."""
    per_node = nproc or env.get("NPROC_PER_NODE") or "1"
    index = env["JOB_COMPLETION_INDEX"]
    if "JOBSET_NAME" in env:
        jobset, replicated = env["JOBSET_NAME"], env.get("REPLICATED_JOB_NAME", "")
        # JobSet pods are <jobset>-<replicatedJob>-<jobIndex>-<podIndex> under the subdomain <jobset>.
        default_addr = f"{jobset}-{replicated}-0-0.{jobset}" if replicated else ""
        addr = env.get("MASTER_ADDR") or default_addr
        launcher = "jobset"
    else:
        addr, launcher = env.get("MASTER_ADDR", ""), "indexedjob"
    if not addr:
        raise ImagenetTrainError(f"launch: {launcher} environment without MASTER_ADDR (pod 0's hostname)")
    return Launch(
        launcher,
        _static(_int(env, "NNODES", launcher), index, per_node, addr, env.get("MASTER_PORT", DEFAULT_PORT)),
    )


def _slurm(env: Mapping[str, str], nproc: str | None) -> Launch:
    """A Slurm task (sbatch/srun): slurm.py reads SLURM_* and looks up the first node."""
    from imagenet_train.launchers.slurm import torchrun_args

    return Launch("slurm", torchrun_args(env, nproc, _local_devices))


def _node_per_replica(env: Mapping[str, str], nproc: str | None) -> Launch:
    """An operator that sets only MASTER_ADDR/WORLD_SIZE/RANK, one replica per node."""
    per_node = nproc or env.get("NPROC_PER_NODE") or "1"
    return Launch(
        "node-per-replica",
        _static(
            _int(env, "WORLD_SIZE", "MASTER_ADDR"),
            env.get("RANK", "0"),
            per_node,
            env["MASTER_ADDR"],
            env.get("MASTER_PORT", DEFAULT_PORT),
        ),
    )


def _standalone(env: Mapping[str, str], nproc: str | None) -> Launch:
    """No launcher: plain single-node torchrun over the local GPUs."""
    return Launch("standalone", ["--standalone", "--nnodes=1", f"--nproc_per_node={nproc or _local_devices()}"])


def by_hand(nnodes: int, nproc: str | None, endpoint: str) -> Launch:
    """`launch --nnodes N --rdzv-endpoint HOST:PORT` on each node: torchrun's c10d rendezvous, as its own flags say."""
    args = [f"--nnodes={nnodes}", f"--nproc_per_node={nproc or _local_devices()}", "--rdzv_backend=c10d"]
    return Launch("rendezvous", [*args, f"--rdzv_endpoint={endpoint}", "--rdzv_id=imagenet-train"], dict(ELASTIC_ENV))


@dataclass(frozen=True)
class Launcher:
    """One launcher `launch` recognises: whether an environment is its, and the torchrun arguments it means."""

    name: str
    detects: Callable[[Mapping[str, str]], bool]
    resolve: Callable[[Mapping[str, str], str | None], Launch]


# First match wins, in this order (the module's docstring lists them); standalone matches any environment.
LAUNCHERS = (
    Launcher("ssh", lambda env: "IMAGENET_TRAIN_NODE_RANK" in env, _ssh),
    Launcher("ngc", lambda env: "NGC_ARRAY_SIZE" in env, _ngc),
    Launcher("kubeflow", lambda env: "PET_NNODES" in env or "PET_NPROC_PER_NODE" in env, _kubeflow),
    Launcher("indexed job", lambda env: "JOB_COMPLETION_INDEX" in env, _indexed),
    Launcher("slurm", lambda env: "SLURM_JOB_ID" in env and ("SLURM_NODEID" in env or "SLURM_PROCID" in env), _slurm),
    Launcher(
        "node-per-replica",
        lambda env: "MASTER_ADDR" in env and "WORLD_SIZE" in env and "LOCAL_RANK" not in env,
        _node_per_replica,
    ),
    Launcher("standalone", lambda env: True, _standalone),
)


def resolve(env: Mapping[str, str], nproc: str | None = None) -> Launch:
    """Choose torchrun arguments from a launcher's environment variables (no I/O but Slurm's node lookup)."""
    launcher = next(launcher for launcher in LAUNCHERS if launcher.detects(env))
    return launcher.resolve(env, nproc)


def _local_devices() -> str:
    try:
        import torch

        return str(max(1, torch.cuda.device_count()))
    except ImportError:
        return "1"


# Signals torchrun forwards to every rank. SIGUSR1/SIGUSR2 are what Slurm's --signal sends before a time
# limit; the ranks treat SIGTERM and SIGUSR1 as pre-emption (finish the step, checkpoint, exit 128+N).
FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"


def torchrun_options(grace_period: float) -> list[str]:
    """Signal forwarding and the shutdown grace period, where this torchrun has the options (torch >= 2.8)."""
    from torch.distributed.run import get_args_parser

    known = {option for action in get_args_parser()._actions for option in action.option_strings}
    options = []
    if "--signals-to-handle" in known:
        options.append(f"--signals-to-handle={FORWARDED_SIGNALS}")
    if "--shutdown-timeout" in known:
        options.append(f"--shutdown-timeout={round(grace_period)}")
    return options


def command(launch: Launch, program: list[str], options: list[str] = ()) -> list[str]:
    """The full torchrun command line for the training program's arguments."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *options,
        *launch.torchrun,
        "-m",
        "imagenet_train.cli",
        *program,
    ]


def _exit_code(failures: dict) -> int:
    """A failed rank's exit code as a shell reports it (128 + N for a rank killed by signal N)."""
    codes = [failure.exitcode for failure in failures.values()]
    worst = next((code for code in codes if code not in (0, None)), 1)
    return 128 - worst if worst < 0 else worst


def run(
    program: list[str],
    nproc: str | None = None,
    dry_run: bool = False,
    grace_period: float = GRACE_PERIOD,
    launch: Launch | None = None,
) -> int:
    """Print the torchrun command for this environment (or `launch`), then run torchrun in this process.

    In-process rather than exec: a signal that stops the job (SIGTERM from the kubelet, SIGUSR1 from
    Slurm) ends in exit code 128 + N after the ranks stopped (each saying what it saved), instead of a traceback.
    Plain torchrun re-raises the SignalException of its agent instead: a traceback and exit 1.
    """
    launch = launch or resolve(os.environ, nproc)
    argv = command(launch, program or ["train", "--help"], torchrun_options(grace_period))
    settings = "".join(f"{key}={value} " for key, value in launch.env.items())
    print(redact(f"imagenet-train launch: {launch.launcher}: {settings}torchrun {' '.join(argv[3:])}"), flush=True)
    if dry_run:
        return 0
    os.environ.update(launch.env)
    os.environ.update(telemetry_defaults(os.environ))  # for torchrun and every rank; the operator's own win
    # torchrun's own settings (the flag's and its fallback), read by every rank too: a rank whose launcher dies
    # gets the same grace (launchers/launcher_death.py), and a torchrun without --shutdown-timeout honours it.
    for name in GRACE_VARIABLES:
        os.environ[name] = str(round(grace_period))
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    if "--signals-to-handle" not in " ".join(argv):  # older torchrun: SIGUSR1 would kill it outright
        signal.signal(signal.SIGUSR1, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    try:
        torchrun(argv[3:])
    except SignalException as stop:
        name = signal.Signals(stop.sigval).name
        # Not "saved": a rank stopped in its wait for a batch while a peer was in a collective leaves without.
        print(
            f"imagenet-train launch: stopped by {name}; the ranks' lines above say where they saved their position, "
            "or why they could not",
            flush=True,
        )
        return 128 + int(stop.sigval)
    except ChildFailedError as failed:
        return _exit_code(failed.failures)
    return 0
