"""`imagenet-train <command>`: parses options and dispatches; the work lives in the other modules."""

from __future__ import annotations

import argparse
import logging
import sys

from imagenet_train import waiting
from imagenet_train.commands import (
    Parser,
    add_command,
    add_version,
    bucket_cmd,
    evaluate_cmd,
    launch_cmd,
    plan_cmd,
    remote_cmd,
    serve_cmd,
    shards_cmd,
    train_cmd,
)
from imagenet_train.commands.train_cmd import train_config  # noqa: F401 (its old home: notebooks import it from here)
from imagenet_train.errors import ImagenetTrainError, PeerLost, Preempted, PreflightFailed, one_line, visible
from imagenet_train.launchers.launcher_death import die_with_launcher
from imagenet_train.redact import redact, redact_logs

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"

# Every command, in the order `imagenet-train --help` lists them; each module declares its own.
COMMANDS = (
    *shards_cmd.COMMANDS,  # shards, summarize, demo-data, fashion-mnist
    *serve_cmd.COMMANDS,  # serve, probe
    *train_cmd.COMMANDS,  # train
    *evaluate_cmd.COMMANDS,  # evaluate
    *plan_cmd.COMMANDS,  # plan
    *bucket_cmd.COMMANDS,  # upload, sync, fill
    *launch_cmd.COMMANDS,  # launch, ray, report
    *remote_cmd.COMMANDS,  # ssh, ssh-node, slurm
)


def build_parser() -> argparse.ArgumentParser:
    """The `imagenet-train` parser: one subcommand per declared command, its arguments generated."""
    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = Parser(
        prog="imagenet-train",
        formatter_class=formatter,
        description="ImageNet to WebDataset shards to multinode DDP training.",
    )
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        add_command(commands, command, formatter)
    return parser


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed, checked command (tests replace this to observe a normal start)."""
    return args.func(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `imagenet-train` console script: parse, check every option, then dispatch."""
    die_with_launcher()  # first: a rank whose torchrun agent is killed from here on must not live on
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    redact_logs(LOG_FORMAT)  # a log line naming a URL never shows its password or signature
    argv = sys.argv[1:] if argv is None else argv
    if not argv:  # as git: the command list, and a usage error's exit code
        build_parser().print_help()
        return 2
    try:
        args = build_parser().parse_args(argv)
        check = getattr(args, "check", None)
        if check:
            check(args)
        return dispatch(args)
    except ImagenetTrainError as error:
        print(f"imagenet-train: error: {visible(redact(one_line(str(error))))}", file=sys.stderr)
        return 2
    except Preempted as stop:
        waiting.leave_now(stop.exit_code)
        return stop.exit_code
    except waiting.Stopping as stop:  # a wait outside training (the rendezvous, a command's own wait)
        print(f"imagenet-train: stopped by {stop}: nothing saved", file=sys.stderr, flush=True)
        waiting.leave_now(stop.exit_code)
        return stop.exit_code
    except (PeerLost, PreflightFailed) as ending:  # a preflight's failures: one line each, on rank 0 only
        print("".join(f"imagenet-train: error: {line}\n" for line in str(ending).splitlines()), end="", file=sys.stderr)
        return ending.exit_code
    except OSError as error:
        if error.filename is None:
            raise
        # This machine's files (a read-only or full disk): one line naming the path, not a traceback.
        print(f"imagenet-train: error: {visible(str(error.filename))}: {error.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
