"""A real training run on the digits: rank 0's start-up line, and --keep-checkpoints leaving the newest N epoch
checkpoints, with --resume latest continuing from the newest and pruning again."""

from __future__ import annotations

import pytest

from conftest import cli, read_metrics

# Two real runs (minutes on a loaded 2-core machine): make faults runs it; tests/unit/test_keep_checkpoints.py checks
# the pruning rule in make test.
pytestmark = pytest.mark.slow

# No val shards: the run trains and checkpoints only (evaluation would take most of the time on a loaded machine).
TINY = ["--arch", "resnet18", "--image-size", "16", "--epoch-batches", "1", "--batch-size", "8", "--workers", "1"]
TINY += ["--shuffle-buffer", "16", "--num-classes", "10", "--no-tensorboard"]


def _train(shards, run_dir, *more: str):
    urls = f"{shards}/imagenet-train-train-{{000000..000010}}.tar"  # 11 x 130 samples
    result = cli("train", "--train-urls", urls, "--train-samples", "1430", *TINY, "--run-dir", str(run_dir), *more)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def _held(run_dir) -> list[str]:
    return sorted(path.name for path in (run_dir / "checkpoints").iterdir())


def test_a_run_keeps_its_newest_n_epoch_checkpoints_and_resumes_from_the_newest(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    first = _train(digit_shards, run_dir, "--epochs", "3", "--keep-checkpoints", "2")
    assert _held(run_dir) == ["epoch-0001.pt", "epoch-0002.pt"]
    assert "training: world size 1, global batch 8 (8 per rank), peak LR 0.003125, mode resampled" in first.stdout
    assert "(1,430 samples in 11 shards, 10 classes); 3 epochs of 1 steps, 3 in all; cpu" in first.stdout
    resumed = _train(digit_shards, run_dir, "--epochs", "4", "--keep-checkpoints", "2", "--resume", "latest")
    assert "epoch-0002.pt: continuing at epoch 3" in resumed.stdout
    assert _held(run_dir) == ["epoch-0002.pt", "epoch-0003.pt"]
    assert [line["epoch"] for line in read_metrics(run_dir)] == [0, 1, 2, 3]
