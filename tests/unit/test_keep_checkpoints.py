"""--keep-checkpoints N: after each whole-epoch checkpoint is written, the older epochs' beyond the newest N go;
never the new one, a newer one (another run's, left in the folder), a mid-epoch one, or anything else."""

from __future__ import annotations

import pytest
import torch

from imagenet_train.rundir import checkpoint

pytestmark = pytest.mark.unit


def _state(run_dir, keep: int) -> checkpoint.RunState:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return checkpoint.RunState(run_dir, {"model": model, "optimizer": optimizer, "scaler": scaler}, {}, keep)


def _names(run_dir) -> list[str]:
    return sorted(path.name for path in (run_dir / "checkpoints").iterdir())


def test_only_the_newest_n_epoch_checkpoints_stay(tmp_path):
    state = _state(tmp_path, keep=2)
    for epoch in range(5):
        state.write(epoch)
    assert _names(tmp_path) == ["epoch-0003.pt", "epoch-0004.pt"]
    assert checkpoint.latest(str(tmp_path)).name == "epoch-0004.pt"


def test_keep_zero_keeps_every_epoch(tmp_path):
    state = _state(tmp_path, keep=0)
    for epoch in range(4):
        state.write(epoch)
    assert len(_names(tmp_path)) == 4


def test_a_newer_checkpoint_of_another_run_in_the_folder_is_never_removed(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "epoch-0089.pt").write_bytes(b"an older run, not resumed")
    state = _state(tmp_path, keep=1)
    state.write(0)
    state.write(1)
    assert _names(tmp_path) == ["epoch-0001.pt", "epoch-0089.pt"]


def test_a_mid_epoch_checkpoint_does_not_prune_epochs_and_other_files_stay(tmp_path):
    from imagenet_train.planning.position import Position

    state = _state(tmp_path, keep=1)
    state.write(0)
    (tmp_path / "checkpoints" / "notes.txt").write_text("mine")
    state.write(0, Position(epoch=1, step=3))
    assert _names(tmp_path) == ["epoch-0000.pt", "epoch-0001-step-000003.pt", "notes.txt"]
    state.write(1)  # the whole epoch supersedes its step checkpoint and, with N = 1, epoch 0
    assert _names(tmp_path) == ["epoch-0001.pt", "notes.txt"]


def test_a_failed_write_prunes_nothing(tmp_path, monkeypatch):
    from imagenet_train.errors import ImagenetTrainError

    state = _state(tmp_path, keep=1)
    state.write(0)

    def full(*_args, **_kwargs):
        raise ImagenetTrainError("disk full")

    monkeypatch.setattr(checkpoint, "save", full)
    with pytest.raises(ImagenetTrainError):
        state.write(1)
    assert _names(tmp_path) == ["epoch-0000.pt"]
