"""A recipe as its anchor runs it, over 2 real gloo ranks: every training image read exactly once per epoch, as the
--log-keys record shows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

from imagenet_train.datasets.index import load_index
from imagenet_train.planning import plan

from conftest import REPO, read_metrics, torchrun

RECIPE = REPO / "recipes" / "rn50-torchvision-v2.yaml"
# The recipe at digit scale: its mode, optimizer, EMA, mixing and augmentation; a small model, size and batch.
AT_DIGIT_SCALE = [
    *("--arch", "resnet18", "--train-crop-size", "32", "--val-resize-size", "32", "--val-crop-size", "32"),
    *("--global-batch-size", "64", "--workers", "2", "--no-hflip", "--shuffle-buffer", "200", "--epochs", "2"),
    *("--eval-every", "2", "--log-keys", "--no-tensorboard"),
]


def _keys(run_dir: Path, epoch: int) -> Counter:
    found: Counter = Counter()
    for rank in range(2):
        found.update((run_dir / "keys" / f"train-epoch{epoch:04d}-rank{rank}.txt").read_text().split())
    return found


def test_the_torchvision_recipe_reads_each_training_image_once_per_epoch_over_two_ranks(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    result = torchrun(
        ["--config", str(RECIPE), "--shards", str(digit_shards), "--run-dir", str(run_dir), *AT_DIGIT_SCALE]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    train_samples = sum(load_index(str(digit_shards)).sizes("train"))
    metrics = read_metrics(run_dir)
    assert [m["epoch"] for m in metrics] == [0, 1]
    for m in metrics:
        seen = _keys(run_dir, m["epoch"])
        assert len(seen) == train_samples and set(seen.values()) == {1}, f"epoch {m['epoch']}: not each image once"
        assert m["train_samples"] == train_samples
    assert yaml.safe_load(RECIPE.read_text())["mode"] in (plan.Mode.SPLIT, plan.Mode.QUEUE)
