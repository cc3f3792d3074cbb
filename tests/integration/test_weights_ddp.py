"""Fine-tuning under `torchrun --nproc_per_node=2`: --weights with a replaced head trains from the file's weights."""

from __future__ import annotations

import torch

from imagenet_train.rundir import checkpoint
from imagenet_train.training import models

from conftest import SMALL_TRAIN, torchrun


def test_two_ranks_fine_tune_from_imagenet_shaped_weights_with_a_new_head(digit_shards, tmp_path):
    torch.manual_seed(123)
    source = models.build_model("resnet18", 1000).state_dict()
    path = tmp_path / "imagenet-resnet18.pt"
    torch.save({f"module.{key}": value for key, value in source.items()}, path)  # as a DDP run saves them
    run_dir = tmp_path / "run"
    args = ["--shards", str(digit_shards), *SMALL_TRAIN, "--run-dir", str(run_dir), "--epochs", "1"]
    result = torchrun([*args, "--epoch-batches", "2", "--weights", str(path), "--weights-head", "replace"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("is freshly initialised for 10 classes (the file's has 1000)") == 1  # rank 0
    trained = checkpoint.load(run_dir / "checkpoints" / "epoch-0000.pt")["model"]
    torch.manual_seed(0)
    fresh = models.build_model("resnet18", 10).state_dict()
    for key in ("conv1.weight", "layer4.1.conv2.weight"):  # two steps moved them from the file's, not this far
        assert (trained[key] - source[key]).norm() < 0.5 * (fresh[key] - source[key]).norm()
    assert trained["fc.weight"].shape == (10, 512)
