"""Progress on the steps that take minutes on ImageNet and said nothing: `shards` listing its source's class
folders, and `evaluate` scoring the val shards (tqdm bars on stderr; --quiet keeps `shards` silent)."""

from __future__ import annotations

import torch

from imagenet_train.config import RunConfig
from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.training.models import architecture

from conftest import cli, write_image_folder


def test_shards_shows_its_scan_of_the_source_and_quiet_hides_it(tmp_path):
    write_image_folder(tmp_path / "in", {"n01": 3, "n02": 3, "n03": 3}, {"n01": 1, "n02": 1, "n03": 1})
    shown = cli("shards", str(tmp_path / "in"), str(tmp_path / "out"))
    assert shown.returncode == 0, shown.stderr
    assert "scanning train" in shown.stderr and "3/3" in shown.stderr
    assert "scanning val" in shown.stderr
    quiet = cli("shards", str(tmp_path / "in"), str(tmp_path / "again"), "--quiet")
    assert quiet.returncode == 0 and "scanning" not in quiet.stderr


def test_evaluate_shows_its_progress_through_the_val_shards(tmp_path):
    write_image_folder(tmp_path / "in", {"n01": 4, "n02": 4, "n03": 4}, {"n01": 4, "n02": 4, "n03": 4})
    convert(str(tmp_path / "in"), str(tmp_path / "shards"), ShardOptions(maxcount=4), progress=False)
    weights = tmp_path / "weights.pt"
    torch.save(architecture(RunConfig(arch="resnet18"), 3).state_dict(), weights)
    small = ["--arch", "resnet18", "--val-resize", "32", "--val-crop-size", "32", "--batch-size", "4", "--workers", "1"]
    result = cli("evaluate", str(weights), "--shards", str(tmp_path / "shards"), *small, "--out", "-", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "evaluating weights.pt" in result.stderr and "batch" in result.stderr
