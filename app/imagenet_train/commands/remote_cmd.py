"""The `ssh`, `ssh-node` and `slurm` commands: their options, checks and hand-off to launchers/ssh, ssh_node, slurm."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from imagenet_train.declarations import number, text
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.launchers.launch import GRACE_PERIOD

SIGNAL = re.compile(r"(R:)?(SIG)?(USR1|USR2|TERM|INT|HUP|\d+)(@\d+)?")


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


def cmd_ssh(args: argparse.Namespace) -> int:
    """Run one `imagenet-train launch` per host over SSH (with --dry-run, print the ssh commands instead)."""
    from imagenet_train.launchers.ssh import (
        SshOptions,
        forwarded_environment,
        parse_hosts,
        run,
        shown_command,
    )

    options = SshOptions(
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


def add_commands(commands, formatter) -> None:
    """Register `ssh`, `ssh-node` and `slurm` on the CLI's subcommands."""
    ssh = commands.add_parser(
        "ssh",
        formatter_class=formatter,
        help="run one `imagenet-train launch` per host over SSH (hosts file; node rank = line order)",
        description="`imagenet-train ssh --hosts FILE -- train --shards URL ...`: host 0 is the rendezvous; "
        "every host's lines come back prefixed with its name; one host failing, Ctrl-C or SIGTERM stops them all.",
    )
    ssh.add_argument(
        "--hosts", type=text, required=True, metavar="FILE", help="one [user@]host[:port] per line; # comments"
    )
    ssh.add_argument(
        "--nproc-per-node",
        type=number(int, 1, 1024),
        default=None,
        help="processes per host (default: its GPUs, else 1)",
    )
    ssh.add_argument("--master-addr", default="", help="address the hosts reach host 0 at (default: its name)")
    ssh.add_argument("--master-port", type=number(int, 1, 65535), default=29500, help="rendezvous port on host 0")
    ssh.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="also pass this variable (the shard I/O variables set here always go; secrets never do)",
    )
    ssh.add_argument("--remote-command", type=text, default="imagenet-train", help="how a host starts imagenet-train")
    ssh.add_argument("--chdir", default="", help="directory to run in on every host")
    ssh.add_argument("--identity", default="", help="ssh private key file (ssh -i)")
    ssh.add_argument("--ssh-option", action="append", default=[], metavar="OPTION", help="ssh -o OPTION")
    ssh.add_argument("--connect-timeout", type=number(float, 1, 3600), default=20, help="seconds ssh waits for a host")
    ssh.add_argument(
        "--grace-period",
        type=number(float, 1, 3600),
        default=GRACE_PERIOD,
        help="seconds a stopping host gets before SIGKILL",
    )
    ssh.add_argument("--dry-run", action="store_true", help="print the ssh commands and exit")
    ssh.add_argument("program", nargs=argparse.REMAINDER, help="imagenet-train command and its options")
    ssh.set_defaults(func=cmd_ssh)

    node = commands.add_parser(
        "ssh-node",
        formatter_class=formatter,
        help="(run by `imagenet-train ssh` on each host) run a command until the SSH session ends",
    )
    node.add_argument(
        "--grace-period", type=number(float, 0, 7200), default=90, help="seconds between SIGTERM and SIGKILL"
    )
    node.add_argument(
        "--environment-on-stdin",
        action="store_true",
        help="first read one JSON line of variables from stdin (credentials kept off the command line)",
    )
    node.add_argument("program", nargs=argparse.REMAINDER, help="imagenet-train command and its options")
    node.set_defaults(func=cmd_ssh_node)

    slurm = commands.add_parser(
        "slurm",
        formatter_class=formatter,
        help="write (and with --submit, submit) an sbatch script running one `imagenet-train launch` per node",
    )
    slurm.add_argument("--nodes", type=number(int, 1, 100_000), default=1, help="nodes")
    slurm.add_argument(
        "--gpus-per-node", type=number(int, 0, 1024), default=0, help="GPUs (training processes) per node; 0: CPU"
    )
    slurm.add_argument(
        "--cpus-per-task", type=number(int, 0, 4096), default=0, help="CPUs per node's task (0: Slurm's default)"
    )
    slurm.add_argument("--partition", default="", help="partition (default: the cluster's)")
    slurm.add_argument("--time", default="", help="time limit, e.g. 2-00:00:00")
    slurm.add_argument(
        "--signal",
        type=_signal,
        default="USR1@120",
        help="signal training gets this many seconds before the time limit ('' none)",
    )
    slurm.add_argument("--requeue", action="store_true", help="after a clean stop on that signal, requeue the job")
    slurm.add_argument("--job-name", type=text, default="imagenet-train", help="job name")
    slurm.add_argument(
        "--output", type=text, default="imagenet-train-%j.out", help="the job's log file (sbatch --output)"
    )
    slurm.add_argument("--script", type=text, default="imagenet-train.sbatch", help="where to write the sbatch script")
    slurm.add_argument("--executable", default="", help="imagenet-train on the nodes (default: this one's path)")
    slurm.add_argument(
        "--sbatch-option",
        action="append",
        default=[],
        metavar="OPTION",
        help="another #SBATCH line, e.g. --sbatch-option=--account=X",
    )
    slurm.add_argument("--submit", action="store_true", help="submit with sbatch and print the job id")
    slurm.add_argument("program", nargs=argparse.REMAINDER, help="imagenet-train command and its options")
    slurm.set_defaults(func=cmd_slurm)
