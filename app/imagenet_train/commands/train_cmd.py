"""the train command: one flag per declared setting, the Config the flags give, and the hand-off to the loop"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from imagenet_train.commands import Command, Parser, add_arguments
from imagenet_train.config import SECTIONS
from imagenet_train.declarations import declared, option


@dataclass
class TrainOptions:
    """`imagenet-train train`: `--config FILE`, then one flag per training setting (config.py)."""

    config_file: str = option(
        "",
        "YAML or JSON file of settings by name (batch_size: 64), or a run's config.json to repeat it; "
        "flags given override it",
        flags=("--config",),
        metavar="FILE",
    )
    print_config: bool = option(
        False,
        "print the resolved settings (defaults, then --config, then flags) and what they derive (world size, "
        "global batch, scaled LR, steps) as YAML, then exit without reading data or starting torch.distributed",
    )


def _groups() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """One group of flags per settings section (data, optim, run), each flag defaulting to absent (SUPPRESS), so
    a flag given overrides `--config`, which overrides the default."""
    return tuple(
        (section.__name__.removesuffix("Config").lower(), tuple(d.name for d, _ in declared(section)))
        for section in SECTIONS
    )


def _config_from(args: argparse.Namespace):
    """Defaults, then the `--config` file's settings, then the flags given."""
    from imagenet_train.config import Config, defaults
    from imagenet_train.config_files import load_settings

    given = vars(args)
    chosen = load_settings(given["config_file"], given) if given.get("config_file") else {}
    return Config().with_values(
        {name: given.get(name, chosen.get(name, default)) for name, default in defaults().items()}
    )


def train_config(options: list[str]):
    """The Config that `imagenet-train train OPTIONS...` would run, for other launchers and notebooks."""
    parser = Parser(prog="imagenet-train train", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(parser, COMMANDS[0])
    return _config_from(parser.parse_args(options))


def cmd_train(args: argparse.Namespace) -> int:
    """Train with the checked Config the flags and --config gave."""
    if args.print_config:
        from imagenet_train.dry_run import launch_world, resolved_yaml

        print(resolved_yaml(args.config, *launch_world()), end="", flush=True)
        return 0
    if args.config.loader.workers:
        from imagenet_train.loading.workers import start_worker_server

        # Before this process imports torch and torchvision (seconds): the forkserver imports its own beside them,
        # and is ready for the first epoch's workers instead of starting once the model is built.
        start_worker_server()
    from imagenet_train.main.train import train

    train(args.config)
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    """Check every rank's node as --preflight does before training, then leave (exit 3 on a failure)."""
    from imagenet_train.ops.preflight import run_preflight
    from imagenet_train.training.dist import cleanup, init_distributed

    info = init_distributed()
    try:
        run_preflight(args.config.for_world(info.world), info)
    finally:
        cleanup()
    return 0


def _check_train(args: argparse.Namespace) -> None:
    """The cross-field checks of a training configuration, before anything starts."""
    from imagenet_train.main.entry_checks import runnable

    cfg = _config_from(args)
    if args.print_config and not (cfg.data.shards or cfg.data.train_urls):  # a recipe alone: show it all the same
        cfg.data.shards = "-"
        args.config = runnable(cfg)
        args.config.data.shards = ""
    else:
        args.config = runnable(cfg)


COMMANDS = (
    Command(
        "train",
        "train (run under torchrun for DDP)",
        TrainOptions,
        cmd_train,
        check=_check_train,
        settings=_groups(),
        description="Train (run under torchrun for DDP). The defaults below are the built-in ones: "
        "`--config FILE --print-config` prints the values a recipe and your flags give, and what they derive.",
    ),
    Command(
        "preflight",
        "check every rank's node before a run: device, all-reduce bandwidth, shard index, run directory (torchrun)",
        TrainOptions,
        cmd_preflight,
        check=_check_train,
        settings=_groups(),
        description="Run under torchrun with the run's own flags or --config: every rank checks its GPU (a known "
        "matmul, free memory), an all-reduce over the world measures bus bandwidth against --preflight-min-busbw, "
        "the shard index must answer, and the run directory must take a file and have room for two checkpoints. "
        "Rank 0 writes RUN_DIR/preflight.json; a failure names rank and host in one line each and exits 3.",
    ),
)
