"""--model-ema over 2 real gloo ranks in split mode, where uneven shards give the ranks different step counts and
the rank that finishes first sits the last steps out under Join: every rank ends the epoch with the same EMA (the
one it evaluates for ema_top1, and rank 0's is the one saved)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import SMALL_TRAIN, read_metrics

DRIVER = Path(__file__).with_name("rank_ema_driver.py")


def _torchrun_driver(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """torchrun of the driver (`train ARGS`, then each rank's EMA to RUN_DIR/ema-rank{R}.pt)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(DRIVER)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        return subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"torchrun did not finish within {timeout}s (hang?): {str(expired.stderr)[-3000:]}")


def test_every_rank_ends_an_uneven_split_epoch_with_the_same_ema(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    args = [*SMALL_TRAIN, "--shards", str(digit_shards), "--mode", "split", "--run-dir", str(run_dir)]
    args += ["--epochs", "1", "--model-ema", "--model-ema-steps", "1", "--warmup-epochs", "0", "--no-tensorboard"]
    result = _torchrun_driver(args)
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = read_metrics(run_dir)
    assert len(set(record["batches_per_rank"])) > 1, "the test needs ranks with different step counts"
    emas = [torch.load(run_dir / f"ema-rank{rank}.pt", weights_only=True) for rank in range(2)]
    assert int(emas[0]["n_averaged"]) == max(record["batches_per_rank"])  # the average of every step taken
    differ = [key for key in emas[0] if not torch.equal(emas[0][key], emas[1][key])]
    assert not differ, f"the ranks' EMAs differ in {len(differ)} tensors, e.g. {differ[:3]}"
    assert "ema_top1" in record


def test_with_gradient_accumulation_the_ema_updates_once_per_optimizer_step_and_stays_identical_on_every_rank(
    digit_shards, tmp_path
):
    run_dir = tmp_path / "run"
    args = [*SMALL_TRAIN, "--shards", str(digit_shards), "--mode", "split", "--run-dir", str(run_dir)]
    args += ["--epochs", "1", "--model-ema", "--model-ema-steps", "1", "--warmup-epochs", "0", "--no-tensorboard"]
    # The global batch is the optimizer's: 192 over 2 ranks x 3 accumulation steps is 32 per rank per batch.
    result = _torchrun_driver([*args, "--global-batch-size", "192", "--grad-accum-steps", "3"])
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads((run_dir / "config.json").read_text())
    assert written["loader"]["batch_size"] == 32
    assert (written["derived"]["global_batch"], written["derived"]["optimizer_batch"]) == (64, 192)
    (record,) = read_metrics(run_dir)
    steps = max(record["batches_per_rank"])
    assert steps % 3, "the test needs an epoch whose last accumulation group is short"
    emas = [torch.load(run_dir / f"ema-rank{rank}.pt", weights_only=True) for rank in range(2)]
    # One update per optimizer step: after every 3rd loader step, and after the epoch's short last group.
    assert [int(ema["n_averaged"]) for ema in emas] == [-(-steps // 3)] * 2
    differ = [key for key in emas[0] if not torch.equal(emas[0][key], emas[1][key])]
    assert not differ, f"the ranks' EMAs differ in {len(differ)} tensors, e.g. {differ[:3]}"
