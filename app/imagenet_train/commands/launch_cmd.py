"""the commands that start or inspect runs: launch, ray, report"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from imagenet_train.commands import Command, deployment_file
from imagenet_train.declarations import option, positional
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.launchers.kinds import TorchrunLaunch
from imagenet_train.launchers.launch import GRACE_PERIOD

PROGRAM = "imagenet-train command and its options"


@dataclass
class LaunchOptions:
    """`imagenet-train launch [OPTIONS] -- PROGRAM...`."""

    nproc_per_node: int | None = option(
        None, "processes per node (default: from the environment, else GPUs)", kind=int, minimum=1, maximum=1024
    )
    nnodes: int = option(
        1, "nodes taking part, with --rdzv-endpoint (as torchrun's --nnodes)", minimum=1, maximum=100_000
    )
    rdzv_endpoint: str = option(
        "",
        "HOST:PORT of the rendezvous on the first node, for a launch by hand on each node (torchrun's c10d "
        "--rdzv-endpoint); default: the launcher's environment says how the nodes meet",
        metavar="HOST:PORT",
    )
    wait_for: str = option("", "first wait until this shard index and its first shard can be read", metavar="INDEX")
    wait_timeout: float = option(1800, "seconds --wait-for keeps trying", kind=float, minimum=0, maximum=7 * 24 * 3600)
    grace_period: float = option(
        GRACE_PERIOD,
        "seconds the ranks get after SIGTERM/SIGUSR1 to finish their step and checkpoint before SIGKILL, "
        "also when launch itself dies (give the pod a terminationGracePeriodSeconds a little longer)",
        kind=float,
        minimum=1,
        maximum=3600,
    )
    deployment: str = option(
        "",
        "the chart's deployment.yaml (its ConfigMap): processes per node, the shards to wait for, the "
        "launcher's environment and the shard and results places for `train`",
        metavar="FILE",
    )
    dry_run: bool = option(False, "print the torchrun command and exit")
    program: list[str] = positional(PROGRAM, rest=True, nonempty=False)


@dataclass
class RayOptions:
    """`imagenet-train ray [OPTIONS] -- train ...`."""

    address: str = option("", "Ray cluster address (default: RAY_ADDRESS, else a local one)")
    workers: int = option(0, "workers, one rank each (0: one per GPU Ray sees)", minimum=0, maximum=100_000)
    gpus: bool | None = option(None, "GPU workers (default: if Ray sees GPUs)", kind=bool, negatable=True)
    max_failures: int = option(3, "restarts after a worker dies before giving up", minimum=0, maximum=1000)
    cpus_per_worker: float = option(1.0, "CPUs Ray reserves for each worker", minimum=0, maximum=4096)
    program: list[str] = positional("`train` and its options", rest=True, nonempty=False)


@dataclass
class ReportOptions:
    """`imagenet-train report RUN_DIR`."""

    run_dir: str = positional("run directory (holds metrics.jsonl); plots go to RUN_DIR/report")


def cmd_launch(args: argparse.Namespace) -> int:
    """Run the program under torchrun as this launcher's (or --deployment's) environment describes it."""
    from imagenet_train.launchers.launch import run

    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    nproc, wait_for, wait_timeout = args.nproc_per_node, args.wait_for, args.wait_timeout
    if args.deployment:
        from imagenet_train.deployment import pod_environment, read_deployment

        deployment = read_deployment(deployment_file(args.deployment))
        os.environ.update(pod_environment(deployment, os.environ))
        nproc = nproc or str(deployment.nproc)
        wait_for, wait_timeout = wait_for or deployment.wait_for, deployment.wait_timeout
        if program[:1] == ["train"]:
            program = [*program, *deployment.train_flags]  # after --config: the deployment's places win
    if wait_for and not args.dry_run:
        from imagenet_train.commands.train_cmd import train_config
        from imagenet_train.ops.probe import wait_for as wait_for_shards
        from imagenet_train.redact import redact

        trust = program[:1] == ["train"] and train_config(program[1:]).data.trust_index  # the run's own choice
        result = wait_for_shards(wait_for, wait_timeout, trust_index=trust)
        ready = f"shards ready: {result.index} ({result.samples} train samples in {result.shards} shards)"
        print(redact(ready), flush=True)
    return run(program, nproc=nproc, dry_run=args.dry_run, grace_period=args.grace_period, launch=_by_hand(args, nproc))


def _by_hand(args: argparse.Namespace, nproc: str | None) -> TorchrunLaunch | None:
    """The rendezvous --nnodes and --rdzv-endpoint describe (None: the environment's launcher decides)."""
    from imagenet_train.launchers.launch import by_hand

    if not args.rdzv_endpoint:
        if args.nnodes > 1:
            raise ImagenetTrainError(f"--nnodes {args.nnodes}: needs --rdzv-endpoint HOST:PORT (the first node's)")
        return None
    return by_hand(args.nnodes, str(nproc) if nproc else None, args.rdzv_endpoint)


def cmd_ray(args: argparse.Namespace) -> int:
    """Train on a Ray cluster with Ray Train and print the last epoch's result."""
    from imagenet_train.launchers.ray_train import RayTrainOptions, run

    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if program[:1] != ["train"]:
        raise ImagenetTrainError(
            "ray: expected the training command after the options, e.g. "
            "`imagenet-train ray --workers 2 -- train --shards URL`"
        )
    options = RayTrainOptions(args.address, args.workers, args.gpus, args.max_failures, args.cpus_per_worker)
    from imagenet_train.commands.train_cmd import train_config

    last = run(train_config(program[1:]), options)
    top1 = f", top-1 {last['top1']:.4f}" if "top1" in last else ""
    print(f"ray: finished epoch {last['epoch']}{top1}", flush=True)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write a run's plots and print its summary table."""
    from pathlib import Path

    from imagenet_train.ops.run_report import report

    table, written = report(Path(args.run_dir))
    print(table)
    print(f"plots: {', '.join(str(path) for path in written)}")
    return 0


COMMANDS = (
    Command(
        "launch",
        "run torchrun with arguments taken from the launcher's environment (the image's entrypoint)",
        LaunchOptions,
        cmd_launch,
        description="Recognises the launcher that started it from its environment (the kinds of "
        "imagenet_train/launchers/kinds.py: SSH, NGC, the chart's Kubernetes kinds, Slurm, or none) and runs "
        "`torchrun ... -m imagenet_train.cli PROGRAM...`, e.g. `imagenet-train launch -- train --shards URL`. "
        "SIGTERM and SIGUSR1 reach every rank as pre-emption: each finishes its step, rank 0 checkpoints, "
        "and launch exits with 128 + the signal's number.",
    ),
    Command(
        "ray",
        "train on a Ray cluster with Ray Train (needs imagenet-train[ray])",
        RayOptions,
        cmd_ray,
        description="Runs `train` in N Ray Train workers, one rank each, in the process group Ray sets up; a "
        "worker that dies restarts the group from the newest checkpoint (as --resume latest), e.g. "
        "`imagenet-train ray --workers 2 -- train --shards URL --checkpoint-every 500`.",
    ),
    Command("report", "PNG plots and a summary table of a run (needs matplotlib)", ReportOptions, cmd_report),
)
