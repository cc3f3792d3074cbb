"""--model-ema across a kill: a run killed mid-epoch and resumed from its mid-epoch checkpoint ends with the
EMA of every step of the epoch, not only of the steps after the resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.rundir import checkpoint

from conftest import cli, write_image_folder

STEPS = 12
ARGS = [
    *("--arch", "resnet18", "--image-size", "32", "--batch-size", "4", "--workers", "1", "--no-tensorboard"),
    *("--epochs", "1", "--epoch-batches", str(STEPS), "--checkpoint-every", "2", "--shuffle-buffer", "10"),
    *("--model-ema", "--model-ema-steps", "1", "--warmup-epochs", "0"),
]


@pytest.fixture(scope="module")
def train_shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ema-shards")
    write_image_folder(root / "in", {"n01": 8, "n02": 8})  # no val split: the test is about training
    convert(str(root / "in"), str(root / "shards"), ShardOptions(maxcount=4), progress=False)
    return root / "shards"


def _killed_mid_epoch(args: list[str], run_dir: Path, timeout: float = 300) -> None:
    """Start training; SIGKILL it once its step-4 checkpoint exists."""
    command = [str(Path(sys.executable).with_name("imagenet-train")), "train", *args]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    try:
        while process.poll() is None and time.monotonic() < deadline:
            if (run_dir / "checkpoints" / "epoch-0000-step-000004.pt").exists():
                process.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == -signal.SIGKILL, "the run should have been killed mid-epoch"


def test_ema_survives_a_mid_epoch_kill_and_resume(train_shards, tmp_path):
    run_dir = tmp_path / "run"
    args = ["--shards", str(train_shards), "--run-dir", str(run_dir), *ARGS]
    _killed_mid_epoch(args, run_dir)
    saved = checkpoint.load(checkpoint.latest(str(run_dir)))
    step = saved["position"]["step"]
    assert 4 <= step < STEPS and int(saved["ema"]["n_averaged"]) == step  # one update per step so far
    resumed = cli("train", *args, "--resume", "latest", timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"continuing at epoch 0, step {step}" in resumed.stdout
    final = checkpoint.load(checkpoint.latest(str(run_dir)))
    assert final["position"] is None and final["epoch"] == 0
    # the resumed EMA went on from the checkpoint's: it has averaged all 12 steps, not the last 12 - step
    assert int(final["ema"]["n_averaged"]) == STEPS
    assert "final weights: raw (no evaluation to compare)" in resumed.stdout
