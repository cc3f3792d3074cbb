"""A shard whose .cls members are out of range or not numbers: each is a corrupt sample, counted, and the
run goes on (before: an index error in the loss, an overflow in the collate, a device-side assert on a GPU)."""

from __future__ import annotations

import io
import multiprocessing
import tarfile
from pathlib import Path

import pytest

from imagenet_train.loading import stages

from .test_index_attacks import TINY_TRAIN, write_index
from conftest import cli, jpeg_bytes, read_metrics

HOSTILE_LABELS = [b"-1", b"2", b"3000000", str(2**80).encode(), b"x", b"1.0", b"", b"9" * 5000]


def write_labelled_shard(path: Path, labels: list[bytes]) -> int:
    """A shard of one good JPEG per label, each with that .cls; returns its size."""
    with tarfile.open(path, "w") as archive:
        for number, label in enumerate(labels):
            for suffix, data in ((".jpg", jpeg_bytes(number)), (".cls", label)):
                info = tarfile.TarInfo(f"{number:06d}{suffix}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return path.stat().st_size


def test_a_training_run_counts_out_of_range_and_malformed_labels_as_corrupt_samples(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    labels = [b"0", b"1"] * 4 + HOSTILE_LABELS  # 8 good samples, the index has 2 classes
    size = write_labelled_shard(shards / "x.tar", labels)
    write_index(shards, [{"url": "x.tar", "nsamples": len(labels), "filesize": size}])
    run = tmp_path / "run"
    result = cli("train", "--shards", str(shards), *TINY_TRAIN, "--mode", "split", "--run-dir", str(run), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "out of range" in result.stderr
    epoch = [line for line in read_metrics(run) if line.get("epoch") == 0 and "corrupt_samples" in line]
    assert epoch and epoch[-1]["corrupt_samples"] == len(HOSTILE_LABELS), read_metrics(run)


@pytest.mark.parametrize("label", HOSTILE_LABELS)
def test_each_hostile_label_is_refused_and_the_edges_are_kept(label):
    with pytest.raises(ValueError):
        stages.class_label(label, 2)
    assert stages.class_label(b"0", 2) == 0 and stages.class_label(b"1\n", 2) == 1


def test_the_loader_counts_a_label_of_the_class_count_as_corrupt(tmp_path):
    write_labelled_shard(tmp_path / "x.tar", [b"0", b"2", b"1"])
    counters = stages.DamageCounters(multiprocessing.get_context("spawn"))
    kept = list(stages.decoded(stages.read_shards([str(tmp_path / "x.tar")]), len, counters, num_classes=2))
    assert [(label, key) for _, label, key in kept] == [(0, "000000"), (1, "000002")]
    assert counters.snapshot()[stages.DamageCounters.CORRUPT] == 1
