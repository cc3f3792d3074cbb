"""`imagenet-train <command>`: parses options and dispatches; the work lives in the other modules."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from imagenet_train.commands import datasets, ops, plan, remote, runs, storage
from imagenet_train.errors import ImagenetTrainError, PeerLost, Preempted, one_line
from imagenet_train.settings import converter, declared, expectation, flag


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error format: one line naming the flag, exit code 2."""

    def error(self, message: str) -> NoReturn:
        message = message.removeprefix("argument ")
        self.exit(2, f"imagenet-train: error: {one_line(message)}\n")


def _add_settings(parser: argparse.ArgumentParser, section) -> None:
    """One flag per declared setting: its type, default, help and range come from the declaration.

    Flags default to absent (SUPPRESS), so a flag given overrides `--config`, which overrides the default.
    """
    group = parser.add_argument_group(type(section).__name__.removesuffix("Config").lower() or "options")
    for declaration, rule in declared(section):
        default = declaration.default
        help_text = rule.help + (f" ({expectation(type(default), rule)})" if rule.choices else "")
        help_text += f" (default: {default})"
        if isinstance(default, bool):
            group.add_argument(
                flag(declaration.name),
                dest=declaration.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            group.add_argument(
                flag(declaration.name),
                dest=declaration.name,
                type=converter(declaration.name, type(default), rule),
                default=argparse.SUPPRESS,
                metavar=declaration.name.upper(),
                help=help_text,
            )


def _config_from(args: argparse.Namespace):
    """Defaults, then the `--config` file's settings, then the flags given."""
    from imagenet_train.config import Config, load_settings

    given = vars(args)
    chosen = load_settings(given["config_file"]) if given.get("config_file") else {}
    cfg = Config()
    for section in cfg.sections():
        for declaration, _ in declared(section):
            name = declaration.name
            setattr(section, name, given.get(name, chosen.get(name, declaration.default)))
    return cfg


def train_config(options: list[str]):
    """The Config that `imagenet-train train OPTIONS...` would run, for other launchers and notebooks."""
    return _config_from(build_parser().parse_args(["train", *options]))


def cmd_train(args: argparse.Namespace) -> int:
    from imagenet_train.training.loop import train

    train(args.config)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from imagenet_train.config import DataConfig, OptimConfig, RunConfig

    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = _Parser(
        prog="imagenet-train",
        formatter_class=formatter,
        description="ImageNet to WebDataset shards to multinode DDP training.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    datasets.add_commands(commands, formatter)  # shards, summarize, demo-data
    ops.add_commands(commands, formatter)  # serve, probe
    train = commands.add_parser("train", formatter_class=formatter, help="train (run under torchrun for DDP)")
    train.add_argument(
        "--config",
        dest="config_file",
        default="",
        metavar="FILE",
        help="YAML or JSON file of settings by name (batch_size: 64), or a run's config.json to repeat it; "
        "flags given override it",
    )
    for section in (DataConfig(), OptimConfig(), RunConfig()):
        _add_settings(train, section)
    train.set_defaults(func=cmd_train, check=_check_train)
    plan.add_commands(commands, formatter)  # plan
    storage.add_commands(commands, formatter)  # upload, sync, fill
    runs.add_commands(commands, formatter)  # launch, ray, report
    remote.add_commands(commands, formatter)  # ssh, ssh-node, slurm
    return parser


def _check_train(args: argparse.Namespace) -> None:
    """The cross-field checks of a training configuration, before anything starts."""
    args.config = _config_from(args).validate()


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed, checked command (tests replace this to observe a normal start)."""
    return args.func(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `imagenet-train` console script: parse, check every option, then dispatch."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = build_parser().parse_args(argv)
        check = getattr(args, "check", None)
        if check:
            check(args)
        return dispatch(args)
    except ImagenetTrainError as error:
        print(f"imagenet-train: error: {one_line(str(error))}", file=sys.stderr)
        return 2
    except Preempted as stop:
        return stop.exit_code
    except PeerLost as lost:
        print(f"imagenet-train: error: {lost}", file=sys.stderr)
        return lost.exit_code
    except OSError as error:
        if error.filename is None:
            raise
        # This machine's files (a read-only or full disk): one line naming the path, not a traceback.
        print(f"imagenet-train: error: {error.filename}: {error.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
