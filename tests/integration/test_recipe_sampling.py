"""Recipes as their anchors read the data, over 2 real gloo ranks, shown by the --log-keys record: every training
image exactly once per epoch; and with repeated augmentation (the torchvision recipe's --ra-reps 4), a fresh
quarter of the images, each exactly 4 times, the epoch as long as one pass."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

from imagenet_train.choices import SEED
from imagenet_train.datasets.source import load_index
from imagenet_train.planning import plan

from conftest import REPO, read_metrics, torchrun

# A recipe at digit scale: its mode, optimizer, EMA, mixing and augmentation; a small model, size and batch.
AT_DIGIT_SCALE = [
    *("--arch", "resnet18", "--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32"),
    *("--global-batch-size", "64", "--workers", "2", "--no-hflip", "--shuffle-buffer", "200", "--epochs", "1"),
    *("--log-keys", "--no-tensorboard"),
]


def _keys(run_dir: Path, epoch: int) -> list[Counter]:
    """Each rank's keys read in `epoch`, counted."""
    return [
        Counter((run_dir / "keys" / f"train-epoch{epoch:04d}-rank{rank}.txt").read_text().split()) for rank in range(2)
    ]


def _train(recipe: str, digit_shards: Path, run_dir: Path) -> tuple[dict, list[Counter]]:
    args = ["--config", str(REPO / "recipes" / recipe), "--shards", str(digit_shards), "--run-dir", str(run_dir)]
    result = torchrun([*args, *AT_DIGIT_SCALE])
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = read_metrics(run_dir)
    return record, _keys(run_dir, 0)


def test_a_recipe_reads_each_training_image_once_per_epoch_over_two_ranks(digit_shards, tmp_path):
    assert yaml.safe_load((REPO / "recipes" / "rn50-dle-90.yaml").read_text())["mode"] in ("split", "queue")
    record, ranks = _train("rn50-dle-90.yaml", digit_shards, tmp_path / "run")
    seen = ranks[0] + ranks[1]
    train_samples = sum(load_index(str(digit_shards)).sizes("train"))
    assert len(seen) == train_samples and set(seen.values()) == {1}, "not each image exactly once"
    assert record["train_samples"] == train_samples


def test_the_torchvision_recipe_reads_a_fresh_quarter_of_the_images_4_times(digit_shards, tmp_path):
    settings = yaml.safe_load((REPO / "recipes" / "rn50-torchvision-v2.yaml").read_text())
    assert settings["ra_reps"] == 4 and settings["mode"] in ("split", "queue")
    record, ranks = _train("rn50-torchvision-v2.yaml", digit_shards, tmp_path / "run")
    seen = ranks[0] + ranks[1]
    sizes = load_index(str(digit_shards)).sizes("train")
    chosen = set(plan.repeated_order(plan.epoch_order(len(sizes), SEED, 0), 4))  # 3 of the 12 shards
    assert len(seen) == sum(sizes[shard] for shard in chosen) and set(seen.values()) == {4}
    assert record["train_samples"] == 4 * len(seen) == sum(sizes[shard] for shard in chosen for _ in range(4))
    assert ranks[0] and ranks[1]  # the copies went to both ranks (which rank takes which: queue mode decides)
