"""A shard whose .cls members are out of range or not numbers: each is a corrupt sample, counted, and the
run goes on (before: an index error in the loss, an overflow in the collate, a device-side assert on a GPU)."""

from __future__ import annotations

import multiprocessing

import pytest

from imagenet_train.loading import stages

from .test_index_attacks import TINY_TRAIN
from conftest import cli, labelled_jpegs, read_metrics, write_index, write_shard

HOSTILE_LABELS = [b"-1", b"2", b"3000000", str(2**80).encode(), b"x", b"1.0", b"", b"9" * 5000]


def test_a_training_run_counts_out_of_range_and_malformed_labels_as_corrupt_samples(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    labels = [b"0", b"1"] * 4 + HOSTILE_LABELS  # 8 good samples, the index has 2 classes
    size = write_shard(shards / "x.tar", labelled_jpegs(labels))
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
    write_shard(tmp_path / "x.tar", labelled_jpegs([b"0", b"2", b"1"]))
    counters = stages.DamageCounters(multiprocessing.get_context("spawn"))
    kept = list(stages.decoded(stages.read_shards([str(tmp_path / "x.tar")]), len, counters, num_classes=2))
    assert [(label, key) for _, label, key in kept] == [(0, "000000"), (1, "000002")]
    assert counters.snapshot()[stages.DamageCounters.CORRUPT] == 1
