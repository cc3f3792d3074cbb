"""Rank 0's start-up line: world size, global batch, peak LR, mode, data and length, with no URL's secret."""

from __future__ import annotations

import pytest

from imagenet_train.config import Config, DataConfig, LoaderConfig
from imagenet_train.rundir.run_record import startup_line

pytestmark = pytest.mark.unit

DERIVED = {
    "world_size": 16,
    "global_batch": 4096,
    "optimizer_batch": 4096,
    "base_lr": 1.7,
    "train_shards": 1282,
    "train_samples": 1281167,
    "num_classes": 1000,
    "epoch_batches": 313,
    "epochs": 16,
    "total_batches": 5008,
    "device": "cuda:0",
    "amp": "torch.bfloat16",
}


def test_the_startup_line_names_world_batch_lr_mode_data_and_length():
    line = startup_line(
        Config(DataConfig(shards="http://shards:8080/shards.json"), LoaderConfig(mode="queue")), DERIVED
    )
    assert line.startswith("training: world size 16, global batch 4,096 (256 per rank), peak LR 1.7, mode queue;")
    assert "data http://shards:8080/shards.json (1,281,167 samples in 1282 shards, 1000 classes)" in line
    assert "16 epochs of 313 steps, 5,008 in all; cuda:0, amp torch.bfloat16" in line


def test_the_startup_line_hides_a_urls_user_and_password():
    line = startup_line(
        Config(DataConfig(train_urls="https://user:s3cret@host/x-{0..9}.tar")), {**DERIVED, "amp": "None"}
    )
    assert "s3cret" not in line and "user" not in line and "https://***@host/x-{0..9}.tar" in line
    assert line.endswith("amp off")
