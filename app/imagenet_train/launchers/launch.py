"""`imagenet-train launch`: turn whichever launcher's environment this pod/job has into torchrun arguments, and
run torchrun in this process.

The kinds it recognises, first match wins, are the table in launchers/kinds.py: `imagenet-train ssh`
(IMAGENET_TRAIN_NODE_RANK, ...), NGC batch (NGC_ARRAY_*), Kubeflow Trainer v2 TrainJob and PyTorchJob (PET_*, set
by the operators), JobSet and Indexed Job (JOB_COMPLETION_INDEX), a Slurm task (SLURM_*, see slurm.py), an operator
that only sets MASTER_ADDR/WORLD_SIZE/RANK per node, and plain single-node torchrun.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence

from imagenet_train.launchers.kinds import ELASTIC_ENV, LauncherKind, TorchrunLaunch, detected, local_devices
from imagenet_train.launchers.launcher_death import GRACE_VARIABLES
from imagenet_train.launchers.telemetry import telemetry_defaults
from imagenet_train.redact import redact

# Seconds the ranks get after SIGTERM/SIGUSR1 to finish their step and checkpoint before SIGKILL (a pod's
# terminationGracePeriodSeconds should be a little longer). The default of `launch` and `ssh`.
GRACE_PERIOD = 80


def by_hand(nnodes: int, nproc: str | None, endpoint: str) -> TorchrunLaunch:
    """`launch --nnodes N --rdzv-endpoint HOST:PORT` on each node: torchrun's c10d rendezvous, as its own flags say."""
    args = [f"--nnodes={nnodes}", f"--nproc_per_node={nproc or local_devices()}", "--rdzv_backend=c10d"]
    args += [f"--rdzv_endpoint={endpoint}", "--rdzv_id=imagenet-train"]
    return TorchrunLaunch(LauncherKind.RENDEZVOUS, args, dict(ELASTIC_ENV))


def resolve(env: Mapping[str, str], nproc: str | None = None) -> TorchrunLaunch:
    """Choose torchrun arguments from a launcher's environment variables (no I/O but Slurm's node lookup)."""
    _, environment = detected(env)
    return environment.resolve(env, nproc)


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


def command(launch: TorchrunLaunch, program: list[str], options: Sequence[str] = ()) -> list[str]:
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
    launch: TorchrunLaunch | None = None,
) -> int:
    """Print the torchrun command for this environment (or `launch`), then run torchrun in this process.

    In-process rather than exec: a signal that stops the job (SIGTERM from the kubelet, SIGUSR1 from
    Slurm) ends in exit code 128 + N after the ranks stopped (each saying what it saved), instead of a traceback.
    Plain torchrun re-raises the SignalException of its agent instead: a traceback and exit 1.
    """
    launch = launch or resolve(os.environ, nproc)
    argv = command(launch, program or ["train", "--help"], torchrun_options(grace_period))
    settings = "".join(f"{key}={value} " for key, value in launch.env.items())
    print(redact(f"imagenet-train launch: {launch.label}: {settings}torchrun {' '.join(argv[3:])}"), flush=True)
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
