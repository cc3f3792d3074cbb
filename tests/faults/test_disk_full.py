"""The run directory on a small tmpfs that fills up at a checkpoint: one line naming the file, every rank
exits 2 (none hangs), the previous checkpoint intact and no partial file; with room again, --resume
latest finishes the epoch with every sample once."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from imagenet_train.ops.serve import NginxServer
from imagenet_train.rundir.directory import consumed_keys

from .injectors import grow_tmpfs, small_tmpfs, train_keys
from .runs import (
    FAULT_TRAIN,
    Row,
    TorchRun,
    account_exact,
    checkpoint_position,
    keys_after,
    outcome_of,
    run_to_end,
    wall_lost,
)

# A resnet18 checkpoint of the digits is ~86 MB (weights and momentum): one fits in 130 MiB, two do not.
TMPFS_MB, GROWN_MB = 130, 600


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_full_run_directory_stops_every_rank_with_one_line_and_resume_finishes(
    four_shards, tmp_path, record, baselines
):
    args = ["--mode", "split", *FAULT_TRAIN]
    with small_tmpfs(tmp_path / "small", TMPFS_MB) as mount, NginxServer(str(four_shards)) as server:
        run_dir = mount / "run"
        full = ["--shards", f"{server.url}/shards.json", "--run-dir", str(run_dir), *args]
        first = TorchRun(full, tmp_path / "first.log", launch=True)
        code = first.wait(timeout=400)
        text = first.output()
        files = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        position = checkpoint_position(run_dir) if files else None
        grow_tmpfs(mount, GROWN_MB)
        resumed = run_to_end([*full, "--resume", "latest"], tmp_path / "second.log", 400, launch=True)
        before = consumed_keys(run_dir, position) if position else set()
        after = keys_after(run_dir, position.step) if position else []
        accounting = account_exact(Counter([*before, *after]), train_keys(four_shards))
    seconds = first.seconds + resumed.seconds
    record(
        Row(
            fault=f"run directory on a {TMPFS_MB} MiB tmpfs fills up at a checkpoint; grown, then --resume latest",
            mode="split",
            outcome=outcome_of(code, text) + "; resumed: " + outcome_of(resumed.process.returncode, resumed.output()),
            lost=accounting.lost,
            repeated=accounting.repeated,
            wall_lost_s=wall_lost(seconds, baselines.over_nginx("four-split", four_shards, args)),
            seconds=round(seconds, 1),
        )
    )
    errors = [line for line in text.splitlines() if line.startswith("imagenet-train: error:")]
    assert errors and "cannot write checkpoint" in errors[0] and "No space left on device" in errors[0], text[-4000:]
    assert str(run_dir) in errors[0] and "MB free" in errors[0]
    assert "Traceback (most recent call last)" not in text
    # Every rank ended with 2 (torchrun's failure summary lists each rank's exit code).
    codes = {int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", text)}
    assert code == 2 or codes == {2}, f"exit {code}, ranks {codes}"
    assert files == ["epoch-0000-step-000004.pt"], f"expected only the intact step-4 checkpoint, found {files}"
    assert position.step == 4
    assert resumed.process.returncode == 0, resumed.output()[-4000:]
    assert accounting.lost == 0 and accounting.repeated == 0 and accounting.unexpected == 0, accounting
