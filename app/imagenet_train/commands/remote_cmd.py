"""The `ssh`, `ssh-node` and `slurm` commands: their options, checks and hand-off to launchers/ssh, ssh_node, slurm."""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from imagenet_train.commands import Command
from imagenet_train.declarations import option, positional
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.launchers.launch import GRACE_PERIOD

SIGNAL = re.compile(r"(R:)?(SIG)?(USR1|USR2|TERM|INT|HUP|\d+)(@\d+)?")
PROGRAM = "imagenet-train command and its options"


def _program(words: list[str]) -> list[str]:
    program = words[1:] if words[:1] == ["--"] else words
    if not program:
        raise ImagenetTrainError("expected the imagenet-train command to run after '--', e.g. -- train --shards URL")
    return program


def _this_executable() -> str:
    """This installation's `imagenet-train`, by absolute path when it exists (a venv need not be on PATH)."""
    script = Path(sys.executable).with_name("imagenet-train")
    return str(script) if script.exists() else "imagenet-train"


def _signal(value: str) -> str:
    """argparse `type=` for sbatch's --signal: [R:]SIG[@SECONDS], or '' for none (no 'B:': see slurm.py)."""
    if value and not SIGNAL.fullmatch(value):
        raise argparse.ArgumentTypeError(f"expected [R:]SIG[@SECONDS] such as USR1@120, got '{value}'")
    return value


@dataclass
class SshOptions:
    """`imagenet-train ssh --hosts FILE [OPTIONS] -- PROGRAM...`."""

    hosts: str = option(
        None, "one [user@]host[:port] per line; # comments", nonempty=True, required=True, metavar="FILE"
    )
    nproc_per_node: int | None = option(
        None, "processes per host (default: its GPUs, else 1)", kind=int, minimum=1, maximum=1024
    )
    master_addr: str = option("", "address the hosts reach host 0 at (default: its name)")
    master_port: int = option(29500, "rendezvous port on host 0", minimum=1, maximum=65535)
    env: list[str] = option(
        [],
        "also pass this variable (the shard I/O variables set here always go; secrets never do)",
        many=True,
        metavar="NAME[=VALUE]",
    )
    remote_command: str = option("imagenet-train", "how a host starts imagenet-train", nonempty=True)
    chdir: str = option("", "directory to run in on every host")
    identity: str = option("", "ssh private key file (ssh -i)")
    ssh_option: list[str] = option([], "ssh -o OPTION", many=True, metavar="OPTION")
    connect_timeout: float = option(20, "seconds ssh waits for a host", kind=float, minimum=1, maximum=3600)
    grace_period: float = option(
        GRACE_PERIOD, "seconds a stopping host gets before SIGKILL", kind=float, minimum=1, maximum=3600
    )
    dry_run: bool = option(False, "print the ssh commands and exit")
    program: list[str] = positional(PROGRAM, rest=True, nonempty=False)


@dataclass
class SshNodeOptions:
    """`imagenet-train ssh-node [OPTIONS] -- PROGRAM...` (run by `imagenet-train ssh` on each host)."""

    grace_period: float = option(90, "seconds between SIGTERM and SIGKILL", kind=float, minimum=0, maximum=7200)
    environment_on_stdin: bool = option(
        False, "first read one JSON line of variables from stdin (credentials kept off the command line)"
    )
    program: list[str] = positional(PROGRAM, rest=True, nonempty=False)


@dataclass
class SlurmOptions:
    """`imagenet-train slurm [OPTIONS] -- PROGRAM...`."""

    nodes: int = option(1, "nodes", minimum=1, maximum=100_000)
    gpus_per_node: int = option(0, "GPUs (training processes) per node; 0: CPU", minimum=0, maximum=1024)
    cpus_per_task: int = option(0, "CPUs per node's task (0: Slurm's default)", minimum=0, maximum=4096)
    partition: str = option("", "partition (default: the cluster's)")
    time: str = option("", "time limit, e.g. 2-00:00:00")
    signal: str = option(
        "USR1@120", "signal training gets this many seconds before the time limit ('' none)", parse=_signal
    )
    requeue: bool = option(False, "after a clean stop on that signal, requeue the job")
    job_name: str = option("imagenet-train", "job name", nonempty=True)
    output: str = option("imagenet-train-%j.out", "the job's log file (sbatch --output)", nonempty=True)
    script: str = option("imagenet-train.sbatch", "where to write the sbatch script", nonempty=True)
    executable: str = option("", "imagenet-train on the nodes (default: this one's path)")
    sbatch_option: list[str] = option(
        [], "another #SBATCH line, e.g. --sbatch-option=--account=X", many=True, metavar="OPTION"
    )
    submit: bool = option(False, "submit with sbatch and print the job id")
    program: list[str] = positional(PROGRAM, rest=True, nonempty=False)


def cmd_ssh(args: argparse.Namespace) -> int:
    """Run one `imagenet-train launch` per host over SSH (with --dry-run, print the ssh commands instead)."""
    from imagenet_train.launchers.ssh import (
        SshLaunchOptions,
        forwarded_environment,
        parse_hosts,
        run,
        shown_command,
    )

    options = SshLaunchOptions(
        hosts=parse_hosts(args.hosts),
        program=_program(args.program),
        environment=forwarded_environment(os.environ, args.env),
        nproc_per_node=str(args.nproc_per_node) if args.nproc_per_node else None,
        master_addr=args.master_addr,
        master_port=args.master_port,
        remote_command=args.remote_command,
        chdir=args.chdir,
        identity=args.identity,
        ssh_options=args.ssh_option,
        connect_timeout=args.connect_timeout,
        grace_period=args.grace_period,
    )
    if args.dry_run:
        for rank in range(len(options.hosts)):
            print(shown_command(options, rank))
        return 0
    return run(options)


def cmd_ssh_node(args: argparse.Namespace) -> int:
    """Run the program on this host until it ends or the SSH session does; its exit code."""
    from imagenet_train.launchers.ssh_node import run

    return run(_program(args.program), args.grace_period, args.environment_on_stdin)


def cmd_slurm(args: argparse.Namespace) -> int:
    """Write the sbatch script that runs one `imagenet-train launch` per node, and with --submit submit it."""
    from imagenet_train.launchers.slurm import BatchJob, submit, write_script

    job = BatchJob(
        program=_program(args.program),
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        cpus_per_task=args.cpus_per_task,
        partition=args.partition,
        time=args.time,
        signal=args.signal,
        output=args.output,
        job_name=args.job_name,
        requeue=args.requeue,
        executable=args.executable or _this_executable(),
        extra=args.sbatch_option,
    )
    script = write_script(job, args.script)
    print(f"sbatch script: {script}", flush=True)
    if args.submit:
        print(f"submitted: job {submit(script)}", flush=True)
    return 0


COMMANDS = (
    Command(
        "ssh",
        "run one `imagenet-train launch` per host over SSH (hosts file; node rank = line order)",
        SshOptions,
        cmd_ssh,
        description="`imagenet-train ssh --hosts FILE -- train --shards URL ...`: host 0 is the rendezvous; every "
        "host's lines come back prefixed with its name; one host failing, Ctrl-C or SIGTERM stops them all.",
    ),
    Command(
        "ssh-node",
        "(run by `imagenet-train ssh` on each host) run a command until the SSH session ends",
        SshNodeOptions,
        cmd_ssh_node,
    ),
    Command(
        "slurm",
        "write (and with --submit, submit) an sbatch script running one `imagenet-train launch` per node",
        SlurmOptions,
        cmd_slurm,
    ),
)
