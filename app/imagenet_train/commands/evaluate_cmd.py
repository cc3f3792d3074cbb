"""the evaluate command (torchvision's --test-only): a checkpoint or weights file scored on the val shards,
under torchrun too, written as JSON with per-class accuracy"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from imagenet_train.commands import Command, one_shot_io_timeout
from imagenet_train.config import defaults
from imagenet_train.declarations import option, positional

# The training settings evaluate takes, with their flags as `train` declares them: where the val shards are
# and how they are read and cropped, and the model they feed.
SETTINGS = (
    "shards",
    "trust_index",
    "train_urls",
    "val_urls",
    "num_classes",
    "batch_size",
    "workers",
    "train_crop_size",
    "val_resize_size",
    "val_crop_size",
    "decoder",
    "on_broken_shard",
    "cache_dir",
    "cache_max_bytes",
    "verify_shards",
    "max_image_pixels",
    "loader_timeout",
    "arch",
    "resnet_width",
    "stem",
    "blurpool",
    "amp",
    "channels_last",
    "val_tta",
)


@dataclass
class EvaluateOptions:
    """`imagenet-train evaluate FILE`; the training settings it takes follow (SETTINGS)."""

    weights: str = positional("a checkpoint, RUN_DIR/final.pt, or a model state dict", metavar="FILE", nonempty=False)
    ema: bool = option(False, "score the EMA weights a --model-ema checkpoint holds")
    out: str = option("", "JSON report file ('-': stdout; empty: eval.json beside FILE)", metavar="FILE")
    config_file: str = option(
        "",
        "settings file, or a run's config.json to read the val shards as that run did; flags override it",
        flags=("--config",),
        metavar="FILE",
    )
    # Its own flag, not the setting: a run's config.json holds training's budget, which a one-shot command
    # against a gone server would sit out for 15 minutes.
    io_timeout: float = one_shot_io_timeout()


def _config_from(args: argparse.Namespace):
    """Defaults, then the `--config` file's settings (a run's config.json repeats its data settings), then flags."""
    from imagenet_train.config import Config
    from imagenet_train.config_files import load_settings
    from imagenet_train.main.entry_checks import runnable

    given = vars(args)
    chosen = load_settings(args.config_file, given) if args.config_file else {}
    default = defaults()
    taken = {name: given.get(name, chosen.get(name, default[name])) for name in SETTINGS}
    return runnable(Config().with_values({**taken, "io_timeout": args.io_timeout}))


def _check(args: argparse.Namespace) -> None:
    """The settings' checks before anything starts."""
    args.config = _config_from(args)


def report(record: dict, weights: str, use_ema: bool, val_tta: bool, arch: str) -> dict:
    """The JSON document of an evaluation: the scores, what was scored, and each class's top-1."""
    samples, hits = record.pop("class_samples"), record.pop("class_top1")
    per_class = [
        {"class": index, "samples": count, "top1": hit / count if count else None}
        for index, (count, hit) in enumerate(zip(samples, hits, strict=True))
    ]
    return {"weights": weights, "ema": use_ema, "arch": arch, "val_tta": val_tta, **record, "per_class": per_class}


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Evaluate the weights on the val shards; write the JSON report and print the summary line."""
    from imagenet_train.io.atomic import atomic_write
    from imagenet_train.io.owned import owned_folder

    cfg = args.config
    # eval.json beside the weights it scored (a --config names another run's folder, which is not this report's);
    # that folder must be ours (io/owned.py), checked before the pass over the val shards.
    beside = "" if args.out else str(Path(args.weights).parent)
    what = f"{beside} (eval.json's folder, beside the weights; --out FILE writes elsewhere)"
    if beside:
        owned_folder(beside, what)
    if cfg.loader.workers:
        from imagenet_train.loading.workers import start_worker_server

        start_worker_server()  # before this process's own imports (torch, torchvision), which its imports then overlap
    from imagenet_train.main.evaluate import evaluate_weights

    record, info = evaluate_weights(cfg, args.weights, args.ema)
    if not info.is_main:
        return 0
    document = report(record, args.weights, args.ema, cfg.run.val_tta, cfg.run.arch)
    text = json.dumps(document, indent=1) + "\n"
    topk = next(key for key in document if key.startswith("top") and key != "top1")
    line = (
        f"evaluate: {args.weights}{' (EMA)' if args.ema else ''}: top1 {document['top1']:.4f} "
        f"{topk} {document[topk]:.4f} over {document['val_samples']} samples on {info.world} ranks"
        f"{' with test-time flip' if cfg.run.val_tta else ''}"
    )
    if args.out == "-":
        sys.stdout.write(text)
        print(line, file=sys.stderr, flush=True)
        return 0
    out = owned_folder(beside, what) / "eval.json" if beside else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out, "w", private=bool(beside)) as stream:  # a link at its name is replaced
        stream.write(text)
    print(f"{line}; written to {out}", flush=True)
    return 0


COMMANDS = (
    Command(
        "evaluate",
        "score a checkpoint or weights file on the val shards: top-1/top-5 and per-class accuracy as JSON "
        "(run under torchrun to split the val shards over ranks)",
        EvaluateOptions,
        cmd_evaluate,
        check=_check,
        settings=(("settings (as train takes them)", SETTINGS),),
    ),
)
