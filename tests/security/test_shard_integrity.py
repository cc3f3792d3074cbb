"""A shard swapped for one with flipped labels and the very same size, served by nginx: with --verify-shards
(the default) it is a broken shard, named; with --cache-dir none of its samples is used; probe and
plan --simulate refuse it."""

from __future__ import annotations

import io
import json
import multiprocessing
import tarfile
from pathlib import Path

import pytest

from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.datasets.source import resolve_source
from imagenet_train.loading.stages import DamageCounters, ShardReading, read_shards

from conftest import cli, write_image_folder


def flip_first_label(shard: Path) -> str:
    """Rewrite the first sample's class digit in place (0 <-> 1): a valid tar of the same size. Its key."""
    data = bytearray(shard.read_bytes())
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
        member = next(m for m in tar if m.name.endswith(".cls"))
    data[member.offset_data] = ord("1") if data[member.offset_data] == ord("0") else ord("0")
    shard.write_bytes(bytes(data))
    return member.name.split(".")[0]


@pytest.fixture
def tampered(hostile_dir: Path, tmp_path: Path, request) -> tuple[str, str]:
    """Three train shards of 4 in the attacker's folder; the first has a flipped label. (its name, the key)"""
    write_image_folder(tmp_path / "source", {"n01": 6, "n02": 6})
    prefix = request.node.name.replace("[", "-").replace("]", "")[:60]  # URLs differ from test to test
    convert(str(tmp_path / "source"), str(hostile_dir), ShardOptions(prefix=prefix, maxcount=4), progress=False)
    name = json.loads((hostile_dir / "shards.json").read_text())["splits"]["train"]["shardlist"][0]["url"]
    size = (hostile_dir / name).stat().st_size
    key = flip_first_label(hostile_dir / name)
    assert (hostile_dir / name).stat().st_size == size
    return name, key


def damage_after(urls: list[str], reading: ShardReading) -> tuple[list[str], tuple[int, int, int]]:
    counters = DamageCounters(multiprocessing.get_context("spawn"))
    keys = [sample["__key__"] for sample in read_shards(urls, reading, counters)]
    return keys, counters.snapshot()


@pytest.mark.timeout(60)
def test_a_shard_with_flipped_labels_and_the_same_size_is_a_broken_shard_named_loudly(
    hostile_server, tampered, caplog, marker
):
    name, _ = tampered
    source = resolve_source(f"{hostile_server.url}/shards.json")
    keys, (corrupt, broken, lost) = damage_after(source.train_urls, ShardReading(expected=source.expected))
    assert broken == 1 and corrupt == 0 and lost == 0
    warnings = [r.getMessage() for r in caplog.records if "broken shard" in r.getMessage()]
    assert len(warnings) == 1 and name in warnings[0] and "sha256" in warnings[0] and "ALREADY USED" in warnings[0]
    # Found at the shard's end, after its samples went by; this process never reads it again.
    assert len(keys) == 12
    again, (_, broken_again, lost_again) = damage_after([source.train_urls[0]], ShardReading(expected=source.expected))
    assert again == [] and broken_again == 1 and lost_again == 4
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_with_a_cache_dir_no_sample_of_a_tampered_shard_is_used_and_it_is_not_cached(
    hostile_server, tampered, tmp_path, marker
):
    name, key = tampered
    source = resolve_source(f"{hostile_server.url}/shards.json")
    cache = tmp_path / "cache"
    reading = ShardReading(expected=source.expected, cache_dir=str(cache))
    keys, (_, broken, lost) = damage_after(source.train_urls, reading)
    assert key not in keys and len(keys) == 8
    assert broken == 1 and lost == 4
    assert sorted(p.name.split("-", 1)[1] for p in cache.iterdir()) == sorted(
        url.rsplit("/", 1)[1] for url in source.train_urls[1:]
    )
    # A cached copy changed on disk afterwards is hashed again before use, refused, and fetched anew.
    copy = next(cache.iterdir())
    copy.write_bytes(b"\x00" * copy.stat().st_size)
    keys, (_, broken, _) = damage_after(source.train_urls[1:], reading)
    assert len(keys) == 8 and broken == 0
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_no_verify_shards_reads_the_tampered_shard_as_before(hostile_server, tampered):
    source = resolve_source(f"{hostile_server.url}/shards.json")
    keys, damage = damage_after(source.train_urls, ShardReading(expected=source.expected, verify=False))
    assert len(keys) == 12 and damage == (0, 0, 0)


@pytest.mark.timeout(300)
def test_train_over_a_tampered_shard_says_so_and_counts_it(hostile_server, tampered, tmp_path, marker):
    name, _ = tampered
    run = tmp_path / "run"
    result = cli(
        "train",
        *("--shards", f"{hostile_server.url}/shards.json", "--arch", "resnet18", "--image-size", "16"),
        *("--val-crop-size", "16"),
        *("--batch-size", "4", "--epochs", "1", "--workers", "1", "--mode", "split", "--no-tensorboard"),
        *("--run-dir", str(run)),
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert any(name in line and "sha256" in line for line in output.splitlines()), output[-3000:]
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["broken_shards"] == 1
    assert not marker.exists()


@pytest.mark.timeout(120)
def test_probe_and_plan_simulate_refuse_a_tampered_shard_by_default(hostile_server, tampered):
    name, _ = tampered
    index = f"{hostile_server.url}/shards.json"
    probe = cli("probe", index)
    assert probe.returncode == 2 and probe.stderr.count("\n") == 1, probe.stderr
    assert name in probe.stderr and "sha256" in probe.stderr
    plan = cli("plan", "--shards", index, "--simulate", "--mode", "split", "--workers", "1", "--batch-size", "4")
    assert plan.returncode == 2 and plan.stderr.count("\n") == 1, plan.stderr
    assert name in plan.stderr and "sha256" in plan.stderr
    assert cli("probe", index, "--no-verify-shards").returncode == 0
