"""Kill a rank mid-epoch (SIGKILL), resume from the mid-epoch checkpoint, and check the data position:
every sample exactly once over both parts (split), or exactly the nominal epoch length (resampled)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imagenet_train.planning import plan
from imagenet_train.planning.position import Position
from imagenet_train.rundir.directory import consumed_keys

from conftest import CHECKPOINTING_TRAIN, child_pids, read_metrics, torchrun

ARGS = CHECKPOINTING_TRAIN


def run_until_killed(args: list[str], run_dir: Path, tmp: Path, timeout: float = 180) -> int:
    """Start a 2-rank torchrun, SIGKILL one rank once a mid-epoch checkpoint exists; return torchrun's exit code."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "imagenet_train.cli",
        "train",
        *args,
    ]
    with open(tmp / "killed.log", "w") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=log, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
        deadline = time.monotonic() + timeout
        try:
            while process.poll() is None and time.monotonic() < deadline:
                if (run_dir / "checkpoints" / "epoch-0000-step-000008.pt").exists():
                    ranks = child_pids(process.pid)
                    assert ranks, "no rank processes found"
                    os.kill(ranks[-1], signal.SIGKILL)
                    break
                time.sleep(0.02)
            return process.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _checkpoint_position(run_dir: Path) -> Position:
    from imagenet_train.rundir.checkpoint import latest, load

    state = load(latest(str(run_dir)))  # weights_only=True: the checkpoint is tensors and plain data
    return Position.from_dict(state["position"])


# One case of each stays in `make test`; the rest (minutes each on 2 cores) run with `make faults`.
@pytest.mark.parametrize(
    ("mode", "ranks_after"),
    [("split", 2), pytest.param("split", 1, marks=pytest.mark.slow), pytest.param("queue", 2, marks=pytest.mark.slow)],
)
def test_exact_modes_resumed_mid_epoch_see_every_sample_exactly_once(digit_shards, tmp_path, mode, ranks_after):
    run_dir = tmp_path / "run"
    args = ["--shards", str(digit_shards), "--mode", mode, "--run-dir", str(run_dir), *ARGS]
    code = run_until_killed(args, run_dir, tmp_path)
    assert code != 0, "the first part should have been killed mid-epoch"
    position = _checkpoint_position(run_dir)
    assert position.epoch == 0 and position.step >= 8
    before = consumed_keys(run_dir, position)
    resumed = torchrun([*args, "--resume", "latest"], nproc=ranks_after)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"continuing at epoch 0, step {position.step}" in resumed.stdout
    if ranks_after != 2:  # an elastic restart with fewer ranks: says what it does, then does it
        assert "world size changed from 2 to 1 mid-epoch: the" in resumed.stdout
    after: list[str] = []
    for log in (run_dir / "position" / "epoch-0000").glob(f"rank-*-from-{position.step:06d}.keys"):
        after += [key for line in log.read_text().splitlines() for key in line.split()[1:]]
    assert len(before) > 0 and len(after) > 0
    assert len(after) == len(set(after)) and not before & set(after)
    assert len(before) + len(after) == 1438  # the union is every training sample, each once
    metrics = read_metrics(run_dir)
    assert metrics[-1]["resumed_from_step"] == position.step and metrics[-1]["train_samples"] == len(after)


@pytest.mark.parametrize("ranks_after", [2, pytest.param(1, marks=pytest.mark.slow)])
def test_resampled_mode_resumed_mid_epoch_keeps_the_nominal_length(digit_shards, tmp_path, ranks_after):
    run_dir = tmp_path / "run"
    args = ["--shards", str(digit_shards), "--run-dir", str(run_dir), *ARGS]
    code = run_until_killed(args, run_dir, tmp_path)
    assert code != 0, "the first part should have been killed mid-epoch"
    position = _checkpoint_position(run_dir)
    resumed = torchrun([*args, "--resume", "latest"], nproc=ranks_after)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    nominal = plan.resampled_epoch_batches(1438, 16, 2)
    metrics = read_metrics(run_dir)
    assert metrics[-1]["resumed_from_step"] == position.step
    # Together the two parts are exactly the nominal epoch: the same batches, or the same samples on fewer ranks.
    left = (nominal - position.step) * 2 // ranks_after
    assert metrics[-1]["batches_per_rank"] == [left] * ranks_after
    assert metrics[-1]["train_samples"] == (nominal - position.step) * 2 * 16


def test_newer_checkpoints_supersede_mid_epoch_ones(tmp_path):
    from imagenet_train.rundir import checkpoint

    for epoch, step in [(0, 4), (0, 8), (1, None)]:
        path = checkpoint.checkpoint_path(str(tmp_path), epoch, step)
        checkpoint.save({"epoch": epoch}, path)
        checkpoint.prune_steps(str(tmp_path), keep=path)
        assert checkpoint.latest(str(tmp_path)) == path
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["epoch-0001.pt"]
