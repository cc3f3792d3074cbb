"""An index listing more class names than any dataset has: refused in one line before a model is sized by it.

Three million names (15 MB, under the index cap) made every rank allocate a 6 GB head; the tests use 150,000,
past the documented maximum of 100,000 (--max-classes), which an old build would still have trained on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagenet_train.datasets import source as shard_index
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.limits import MAX_CLASSES

from .test_index_attacks import TINY_TRAIN, refused, two_sample_shard
from conftest import cli, write_index

MANY = 150_000


def with_classes(folder: Path, count: int) -> Path:
    """A valid index in `folder` (one real shard) whose classes list `count` names."""
    size = two_sample_shard(folder / "x.tar")
    path = write_index(folder, [{"url": "x.tar", "nsamples": 2, "filesize": size}])
    document = json.loads(path.read_text())
    document["classes"] = [f"n{number:08d}" for number in range(count)]
    path.write_text(json.dumps(document))
    return path


def test_train_on_an_index_with_150000_classes_is_one_line_before_any_model(hostile_dir, hostile_server, tmp_path):
    with_classes(hostile_dir, MANY)
    index = f"{hostile_server.url}/shards.json"
    result = cli("train", "--shards", index, *TINY_TRAIN, "--run-dir", str(tmp_path / "run"), timeout=120)
    refused(result, index, f"{MANY} classes", "at most 100000", "--max-classes")
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").rglob("*.pt"))


def test_num_classes_given_on_the_command_line_is_bounded_too(tmp_path):
    from imagenet_train.datasets.source import resolve_source

    with pytest.raises(ImagenetTrainError, match=f"--num-classes: {MANY} classes; expected at most 100000"):
        resolve_source("", f"{tmp_path}/x.tar", "", 2, MANY)


def test_the_maximum_is_inclusive_and_can_be_raised(tmp_path):
    maximum, load_index = MAX_CLASSES, shard_index.load_index
    (tmp_path / "at").mkdir()
    (tmp_path / "over").mkdir()
    assert len(load_index(str(with_classes(tmp_path / "at", maximum))).classes) == maximum
    over = str(with_classes(tmp_path / "over", maximum + 1))
    assert len(load_index(over, max_classes=maximum + 1).classes) == maximum + 1
