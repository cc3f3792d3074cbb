"""`train --weights` through the command line: a head of another size and a pickle-holding file stop the run
with one line and exit code 2, before any batch is read."""

from __future__ import annotations

import argparse

import torch

from imagenet_train.training import models

from conftest import SMALL_TRAIN, cli


def _train(digit_shards, tmp_path, *extra: str):
    return cli("train", "--shards", str(digit_shards), *SMALL_TRAIN, "--run-dir", str(tmp_path / "run"), *extra)


def _last_line(result) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_train_refuses_weights_with_a_head_for_another_class_count(digit_shards, tmp_path):
    path = tmp_path / "imagenet-resnet18.pt"
    torch.save(models.build_model("resnet18", 1000).state_dict(), path)
    line = _last_line(_train(digit_shards, tmp_path, "--weights", str(path)))
    assert line == (
        f"imagenet-train: error: --weights {path}: the head fc.weight is [1000, 512] in the file but [10, 512] "
        "here (10 classes); --weights-head replace loads the rest and trains a new head"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_train_refuses_weights_that_hold_python_objects(digit_shards, tmp_path):
    path = tmp_path / "pickled.pt"
    torch.save({"model": models.build_model("resnet18", 10).state_dict(), "args": argparse.Namespace(lr=0.1)}, path)
    line = _last_line(_train(digit_shards, tmp_path, "--weights", str(path)))
    assert line.startswith(f"imagenet-train: error: {path}: this weights file holds Python objects")
    assert "argparse.Namespace" in line and "refused" in line
