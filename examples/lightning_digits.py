#!/usr/bin/env python3
"""Train with Lightning on shards: `python examples/lightning_digits.py --shards URL --epochs 12 [train options]`.

Takes the options of `imagenet-train train`, and --stop-at-top1 P to end the fit early (Lightning's
EarlyStopping) once an epoch's validation top-1 exceeds P; Lightning's DDP starts the other ranks by running this
script again. Rank 0 prints the final validation metrics as one JSON line. Lightning runs resampled mode only:
with a recipe in queue or split mode (recipes/small-images.yaml is in queue mode), add `--mode resampled`.
"""

import argparse
import json
import signal
import sys

from imagenet_train.commands.train_cmd import train_config
from imagenet_train.errors import ImagenetTrainError

# `lightning` comes through the adapter, which first makes torchvision importable next to a CPU-only torch.
from imagenet_train.launchers.lightning_module import ImagenetModule, ShardDataModule, lightning


def top1_threshold(text: str) -> float:
    """--stop-at-top1's value: a top-1 that an epoch can exceed, from 0 up to (not including) 1."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a top-1 from 0 up to 1 (not included), got '{text[:40]}'")
    return value


def script_options(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's own options, and the rest for `imagenet-train train`'s parser (whose --help follows ours)."""
    parser = argparse.ArgumentParser(
        prog="lightning_digits.py", add_help=False, allow_abbrev=False, exit_on_error=False
    )
    parser.add_argument(
        "--stop-at-top1",
        type=top1_threshold,
        metavar="P",
        help="end the fit early, before --epochs, once an epoch's validation top-1 (0-1) exceeds P "
        "(Lightning's EarlyStopping); the run counts as done, so its TrainJob progress shows 100%%",
    )
    own, rest = parser.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        parser.print_help()
        print("\nand every option of imagenet-train train:\n")
    return own, rest


def main() -> int:
    """Train, then print rank 0's final validation metrics; a bad option is one line and exit 2."""
    try:
        own, options = script_options(sys.argv[1:])
    except argparse.ArgumentError as error:
        print(f"lightning_digits: error: {str(error).removeprefix('argument ')}", file=sys.stderr)
        return 2
    try:
        cfg = train_config(options)
        data = ShardDataModule(cfg)
        model = ImagenetModule(cfg, data.source.num_classes)
        callbacks = []
        if own.stop_at_top1 is not None:
            # A patience of the whole run: the threshold alone ends it, never a plateau of top-1.
            threshold, patience = own.stop_at_top1, cfg.run.epochs
            stop = lightning.pytorch.callbacks.EarlyStopping(
                "top1", mode="max", stopping_threshold=threshold, patience=patience
            )
            callbacks.append(stop)
        trainer = lightning.Trainer(
            strategy="ddp",
            accelerator="cpu",
            devices=2,
            max_epochs=cfg.run.epochs,
            default_root_dir=cfg.run.run_dir,
            enable_checkpointing=False,
            enable_progress_bar=False,
            num_sanity_val_steps=0,
            callbacks=callbacks,
        )
        trainer.fit(model, datamodule=data)
    except ImagenetTrainError as error:
        print(f"lightning_digits: error: {error}", file=sys.stderr)
        return 2
    except lightning.pytorch.utilities.exceptions.SIGTERMException:
        # Lightning ends a fit stopped by SIGTERM with a bare SystemExit, status 0, which a Job or TrainJob would
        # count as success; 128 + 15, as `imagenet-train train` exits, reads as pre-empted.
        print("lightning_digits: stopped by SIGTERM (pre-empted): the fit did not finish", file=sys.stderr)
        return 128 + signal.SIGTERM
    if trainer.is_global_zero:
        print(json.dumps(model.history[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
