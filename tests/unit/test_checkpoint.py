"""Checkpoints and weights files: tensors and plain data, read with weights_only=True; the epoch state's
private folder; the atomic writer."""

from __future__ import annotations

import argparse
import enum
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from imagenet_train import weights_files
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.atomic import atomic_write
from imagenet_train.loading.epochstate import EpochState, EpochStateFile, read_epoch_state
from imagenet_train.rundir import checkpoint

pytestmark = pytest.mark.unit


class Colour(enum.Enum):
    RED = "red"


@dataclass
class Recipe:
    lr: float
    where: Path


def test_a_checkpoint_with_enums_arrays_and_dataclasses_is_saved_as_plain_data(tmp_path):
    path = checkpoint.checkpoint_path(str(tmp_path), 0)
    state = {
        "epoch": np.int64(0),
        "model": {"w": torch.ones(2)},
        "optimizer": {"state": {0: {"momentum_buffer": torch.zeros(2)}}},
        "scaler": {},
        "extra": [Colour.RED, np.arange(3), Recipe(0.1, Path("/x")), argparse.Namespace(a=1), {"b", "a"}],
    }
    checkpoint.save(state, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded["epoch"] == 0 and torch.equal(loaded["model"]["w"], torch.ones(2))
    red, array, recipe, namespace, names = loaded["extra"]
    assert (red, recipe, namespace, names) == ("red", {"lr": 0.1, "where": "/x"}, {"a": 1}, ["a", "b"])
    assert torch.equal(array, torch.arange(3))
    assert checkpoint.load(path)["optimizer"]["state"][0]["momentum_buffer"].shape == (2,)


def test_an_object_that_is_not_plain_data_is_never_saved(tmp_path):
    path = checkpoint.checkpoint_path(str(tmp_path), 0)
    with pytest.raises(TypeError, match=r"checkpoint\['model'\]: object"):
        checkpoint.save({"epoch": 0, "model": object()}, path)
    assert not path.parent.exists() or not list(path.parent.iterdir())


def test_load_weights_reads_a_state_dict_or_a_checkpoints_model(tmp_path):
    weights = {"fc.weight": torch.ones(2, 2)}
    torch.save(weights, tmp_path / "w.pt")
    assert torch.equal(weights_files.load_weights(tmp_path / "w.pt")["fc.weight"], torch.ones(2, 2))
    path = checkpoint.checkpoint_path(str(tmp_path), 3)
    checkpoint.save({"epoch": 3, "model": weights, "optimizer": {}, "scaler": {}}, path)
    assert list(weights_files.load_weights(path)) == ["fc.weight"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"fc.weight": [1, 2]}, "expected a state dict of tensors"),
        (None, "expected a state dict of tensors"),
        (b"not a torch file", "unreadable weights file"),
    ],
)
def test_a_weights_file_that_is_not_tensors_is_one_error(tmp_path, content, message):
    path = tmp_path / "w.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    with pytest.raises(ImagenetTrainError, match=message):
        weights_files.load_weights(path)
    with pytest.raises(ImagenetTrainError, match="no such weights file"):
        weights_files.load_weights(tmp_path / "missing.pt")


def test_a_plain_file_that_is_not_a_checkpoint_is_one_error(tmp_path):
    torch.save({"epoch": 1}, tmp_path / "epoch-0001.pt")
    with pytest.raises(ImagenetTrainError, match="not an imagenet-train checkpoint"):
        checkpoint.load(tmp_path / "epoch-0001.pt")


def test_a_failed_atomic_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "index.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(path, "w") as stream:
        stream.write("new")
        raise RuntimeError("disk gone")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["index.json"]
    with atomic_write(path, "w") as stream:
        stream.write("new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["index.json"]
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_the_epoch_state_lives_in_a_private_folder_and_goes_on_close(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    state_file = EpochStateFile()
    folder = Path(state_file.folder)
    assert folder.parent == tmp_path and folder.stat().st_mode & 0o777 == 0o700
    state = EpochState(2, frozenset({"k1", "k0"}), ":1", None)
    state_file.write(state)
    assert read_epoch_state(state_file.path) == state
    assert os.listdir(folder) == ["state.json"]  # no temporary left beside it
    state_file.close()
    assert not folder.exists()


def test_an_epoch_state_in_a_folder_others_may_write_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    state_file = EpochStateFile()
    state_file.write(EpochState(0, frozenset(), "", 3))
    os.chmod(state_file.folder, 0o777)
    with pytest.raises(ImagenetTrainError, match="expected a private directory"):
        read_epoch_state(state_file.path)
    state_file.close()


def test_the_newest_checkpoint_is_the_furthest_epoch_then_step_with_a_whole_epoch_last():
    names = ["epoch-0001-step-000010.pt", "epoch-0000.pt", "epoch-0001-step-000004.pt", "notes.txt"]
    assert checkpoint.newest(names) == "epoch-0001-step-000010.pt"
    assert checkpoint.newest([*names, "epoch-0001.pt"]) == "epoch-0001.pt"
    assert checkpoint.newest(["notes.txt"]) is None
