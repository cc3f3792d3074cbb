"""the commands that start or inspect runs: launch, ray, report"""

from __future__ import annotations

import argparse
import os

from imagenet_train.commands import deployment_file
from imagenet_train.declarations import number, text
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.launchers.launch import GRACE_PERIOD


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

        trust = program[:1] == ["train"] and train_config(program[1:]).data.trust_index  # the run's own choice
        result = wait_for_shards(wait_for, wait_timeout, trust_index=trust)
        print(f"shards ready: {result.index} ({result.samples} train samples in {result.shards} shards)", flush=True)
    return run(program, nproc=nproc, dry_run=args.dry_run, grace_period=args.grace_period)


def cmd_ray(args: argparse.Namespace) -> int:
    """Train on a Ray cluster with Ray Train and print the last epoch's result."""
    from imagenet_train.launchers.ray_train import RayOptions, run

    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if program[:1] != ["train"]:
        raise ImagenetTrainError(
            "ray: expected the training command after the options, e.g. "
            "`imagenet-train ray --workers 2 -- train --shards URL`"
        )
    options = RayOptions(args.address, args.workers, args.gpus, args.max_failures, args.cpus_per_worker)
    from imagenet_train.commands.train_cmd import train_config

    last = run(train_config(program[1:]), options)
    top1 = f", top-1 {last['top1']:.4f}" if "top1" in last else ""
    print(f"ray: finished epoch {last['epoch']}{top1}", flush=True)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write a run's plots and print its summary table."""
    from pathlib import Path

    from imagenet_train.training.run_report import report

    table, written = report(Path(args.run_dir))
    print(table)
    print(f"plots: {', '.join(str(path) for path in written)}")
    return 0


def add_commands(commands: argparse._SubParsersAction, formatter: type) -> None:
    """Add the commands that start or inspect runs to the CLI."""
    seconds = number(float, 0, 7 * 24 * 3600)
    launch = commands.add_parser(
        "launch",
        formatter_class=formatter,
        help="run torchrun with arguments taken from the launcher's environment (the image's entrypoint)",
        description="Reads NGC, PyTorchJob, TrainJob, JobSet, Indexed Job or plain environments and runs "
        "`torchrun ... -m imagenet_train.cli PROGRAM...`, e.g. `imagenet-train launch -- train --shards URL`. "
        "SIGTERM and SIGUSR1 reach every rank as pre-emption: each finishes its step, rank 0 checkpoints, "
        "and launch exits with 128 + the signal's number.",
    )
    launch.add_argument(
        "--nproc-per-node",
        type=number(int, 1, 1024),
        default=None,
        help="processes per node (default: from the environment, else GPUs)",
    )
    launch.add_argument(
        "--wait-for",
        default="",
        metavar="INDEX",
        help="first wait until this shard index and its first shard can be read",
    )
    launch.add_argument("--wait-timeout", type=seconds, default=1800, help="seconds --wait-for keeps trying")
    launch.add_argument(
        "--grace-period",
        type=number(float, 1, 3600),
        default=GRACE_PERIOD,
        help="seconds the ranks get after SIGTERM/SIGUSR1 to finish their step and checkpoint before SIGKILL, "
        "also when launch itself dies (give the pod a terminationGracePeriodSeconds a little longer)",
    )
    launch.add_argument(
        "--deployment",
        default="",
        metavar="FILE",
        help="the chart's deployment.yaml (its ConfigMap): processes per node, the shards to wait for, the "
        "launcher's environment and the shard and results places for `train`",
    )
    launch.add_argument("--dry-run", action="store_true", help="print the torchrun command and exit")
    launch.add_argument("program", nargs=argparse.REMAINDER, help="imagenet-train command and its options")
    launch.set_defaults(func=cmd_launch)

    ray = commands.add_parser(
        "ray",
        formatter_class=formatter,
        help="train on a Ray cluster with Ray Train (needs imagenet-train[ray])",
        description="Runs `train` in N Ray Train workers, one rank each, in the process group Ray sets up; a "
        "worker that dies restarts the group from the newest checkpoint (as --resume latest), e.g. "
        "`imagenet-train ray --workers 2 -- train --shards URL --checkpoint-every 500`.",
    )
    ray.add_argument("--address", default="", help="Ray cluster address (default: RAY_ADDRESS, else a local one)")
    ray.add_argument(
        "--workers", type=number(int, 0, 100_000), default=0, help="workers, one rank each (0: one per GPU Ray sees)"
    )
    ray.add_argument(
        "--gpus", action=argparse.BooleanOptionalAction, default=None, help="GPU workers (default: if Ray sees GPUs)"
    )
    ray.add_argument(
        "--max-failures", type=number(int, 0, 1000), default=3, help="restarts after a worker dies before giving up"
    )
    ray.add_argument(
        "--cpus-per-worker", type=number(float, 0, 4096), default=1.0, help="CPUs Ray reserves for each worker"
    )
    ray.add_argument("program", nargs=argparse.REMAINDER, help="`train` and its options")
    ray.set_defaults(func=cmd_ray)

    report = commands.add_parser(
        "report", formatter_class=formatter, help="PNG plots and a summary table of a run (needs matplotlib)"
    )
    report.add_argument("run_dir", type=text, help="run directory (holds metrics.jsonl); plots go to RUN_DIR/report")
    report.set_defaults(func=cmd_report)
