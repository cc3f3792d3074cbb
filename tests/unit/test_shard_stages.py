"""The stages read_shards chains (url opener, size check, hashing reader, tar expander), each driven alone over
small shards written in tmp_path."""

from __future__ import annotations

import hashlib
import io
import logging
import multiprocessing
import tarfile
from pathlib import Path

import pytest

from imagenet_train.choices import BrokenShardPolicy
from imagenet_train.datasets.source import ShardInfo
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.integrity import VerifyingReader
from imagenet_train.loading import stages

pytestmark = pytest.mark.unit


def write_shard(path: Path, samples: int) -> Path:
    """A shard of `samples` samples, each a .jpg and a .cls member."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for number in range(samples):
            for extension, data in (("jpg", b"x" * 700), ("cls", b"1")):
                info = tarfile.TarInfo(f"s{number:03d}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def counters() -> stages.DamageCounters:
    return stages.DamageCounters(multiprocessing.get_context("spawn"))


def test_the_opener_skips_a_shard_that_failed_its_sha256_before_as_broken_and_empty(tmp_path):
    bad, good = str(write_shard(tmp_path / "bad.tar", 2)), str(write_shard(tmp_path / "good.tar", 1))
    expected = {bad: ShardInfo(2, None, "0" * 64), good: ShardInfo(1)}
    reading = stages.ShardReading(expected=expected)
    tally = counters()
    assert len(list(stages.read_shards([bad], reading, tally))) == 2  # the mismatch shows at the shard's end
    outcomes = stages.ShardOutcomes(reading, tally)
    opened = list(stages.opened(stages.shards_of([bad, good], reading), reading, outcomes))
    assert [shard.url for shard in opened] == [good]
    assert tally.snapshot() == (0, 2, 2) and outcomes.empty == 1  # the skipped shard counts as empty
    assert opened[0].stream.closed  # closed once the next shard was asked for


def test_the_size_check_warns_once_when_a_shard_is_not_the_size_its_index_records(tmp_path, caplog):
    url = str(write_shard(tmp_path / "a.tar", 1))
    size = Path(url).stat().st_size
    reading = stages.ShardReading(expected={url: ShardInfo(1, size + 512)})
    outcomes = stages.ShardOutcomes(reading)
    for _ in range(2):
        shards = stages.size_checked(stages.opened(stages.shards_of([url], reading), reading, outcomes))
        assert [shard.url for shard in shards] == [url]
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings == [f"shard {url} is {size} bytes; the index says {size + 512}"]


def test_only_shards_with_a_sha256_to_check_are_read_through_the_hashing_reader(tmp_path):
    checked, unchecked = (str(write_shard(tmp_path / f"{name}.tar", 1)) for name in ("checked", "unchecked"))
    reading = stages.ShardReading(expected={checked: ShardInfo(1, None, sha256_of(Path(checked)))})
    shards = stages.shards_of([checked, unchecked], reading)
    verifiers = [shard.verifier for shard in stages.hashed(shards, reading)]
    assert isinstance(verifiers[0], VerifyingReader) and verifiers[1] is None
    off = stages.ShardReading(expected=reading.expected, verify=False)
    assert [shard.verifier for shard in stages.hashed(stages.shards_of([checked], off), off)] == [None]


def test_the_expander_keeps_the_samples_before_the_damage_and_counts_the_lost_ones(tmp_path, caplog):
    url = tmp_path / "cut.tar"
    data = write_shard(url, 3).read_bytes()
    url.write_bytes(data[: 512 * 11])  # two samples of 5 blocks each whole, the third's header and no data
    reading = stages.ShardReading(expected={str(url): ShardInfo(3)})
    tally = counters()
    outcomes = stages.ShardOutcomes(reading, tally)
    shards = stages.opened(stages.shards_of([str(url)], reading), reading, outcomes)
    keys = [sample["__key__"] for sample in stages.expanded(shards, outcomes)]
    assert keys == ["s000", "s001"] and tally.snapshot() == (0, 1, 1)
    assert "kept 2 samples, lost 1" in caplog.text


def test_the_expander_finds_a_digest_mismatch_at_the_shards_end_after_its_samples(tmp_path, caplog):
    url = str(write_shard(tmp_path / "swapped.tar", 2))
    reading = stages.ShardReading(expected={url: ShardInfo(2, None, "f" * 64)})
    tally = counters()
    outcomes = stages.ShardOutcomes(reading, tally)
    shards = stages.hashed(stages.opened(stages.shards_of([url], reading), reading, outcomes), reading)
    assert len(list(stages.expanded(shards, outcomes))) == 2
    assert tally.snapshot() == (0, 1, 0) and "ALREADY USED" in caplog.text


def test_under_on_broken_shard_fail_the_first_broken_shard_is_a_one_line_error(tmp_path):
    url = tmp_path / "cut.tar"
    url.write_bytes(write_shard(url, 2).read_bytes()[:700])
    reading = stages.ShardReading(on_broken=BrokenShardPolicy.FAIL.value)
    with pytest.raises(ImagenetTrainError, match=r"cut\.tar: broken shard \(.*; --on-broken-shard fail\)"):
        list(stages.read_shards([str(url)], reading))


def test_a_run_of_empty_shards_ends_the_stream_and_a_sample_resets_the_run(tmp_path):
    outcomes = stages.ShardOutcomes(stages.ShardReading(), max_empty=3)
    shard = stages.Shard(str(tmp_path / "empty.tar"))
    for count in (0, 0, 5, 0, 0):
        outcomes.done(shard, count)
    with pytest.raises(ImagenetTrainError, match="empty.tar: 3 shards in a row held no samples"):
        outcomes.done(shard, 0)
