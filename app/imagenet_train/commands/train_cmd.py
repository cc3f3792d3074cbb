"""the train command: one flag per declared setting, the Config the flags give, and the hand-off to the loop"""

from __future__ import annotations

import argparse

from imagenet_train.commands import Parser
from imagenet_train.declarations import add_flag, declared


def _add_settings(parser: argparse.ArgumentParser, section) -> None:
    """One flag per declared setting: its type, default, help and range come from the declaration.

    Flags default to absent (SUPPRESS), so a flag given overrides `--config`, which overrides the default.
    """
    group = parser.add_argument_group(type(section).__name__.removesuffix("Config").lower() or "options")
    for declaration, rule in declared(section):
        add_flag(group, declaration, rule)


def _add_options(train: argparse.ArgumentParser) -> None:
    """`--config FILE` and the declared settings, as `train` takes them."""
    from imagenet_train.config import DataConfig, OptimConfig, RunConfig

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


def _config_from(args: argparse.Namespace):
    """Defaults, then the `--config` file's settings, then the flags given."""
    from imagenet_train.config import Config
    from imagenet_train.config_files import load_settings

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
    parser = Parser(prog="imagenet-train train", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _add_options(parser)
    return _config_from(parser.parse_args(options))


def cmd_train(args: argparse.Namespace) -> int:
    """Train with the checked Config the flags and --config gave."""
    from imagenet_train.training.run import train

    train(args.config)
    return 0


def _check_train(args: argparse.Namespace) -> None:
    """The cross-field checks of a training configuration, before anything starts."""
    args.config = _config_from(args).validate()


def add_commands(commands: argparse._SubParsersAction, formatter: type) -> None:
    """Add `train` to the CLI."""
    train = commands.add_parser("train", formatter_class=formatter, help="train (run under torchrun for DDP)")
    _add_options(train)
    train.set_defaults(func=cmd_train, check=_check_train)
