"""A hostile shard index: it names data, never programs or this node's files, and its claims are bounded.

Each index is served by a real nginx (or a GCS emulator) on 127.0.0.1 and read through the real CLI. An
attack that ran would leave the `marker` file; a refusal is exit code 2 and one line naming the index and
the entry.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagenet_train.io import gcs

from conftest import cli, gcs_emulator, labelled_jpegs, write_index, write_shard

TINY_TRAIN = [
    *("--arch", "resnet18", "--image-size", "32", "--val-resize", "32", "--val-crop-size", "32"),
    *("--batch-size", "2", "--workers", "0"),
    *("--epochs", "1", "--no-tensorboard", "--no-hflip", "--shuffle-buffer", "0"),
]
BUCKET = "imagenet-train-attacks"


def two_sample_shard(path: Path) -> int:
    """A real WebDataset shard of two (jpg, cls) pairs; returns its size in bytes."""
    return write_shard(path, labelled_jpegs([b"0", b"0"]))


def refused(result, index: str, *expected: str) -> str:
    """The one error line of a refused run (exit 2), which names the index and the entry."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("imagenet-train: error: "), result.stderr[-3000:]
    assert index in lines[0] and all(text in lines[0] for text in expected), lines[0]
    assert len(lines[0]) < 400
    return lines[0]


def run_command(command: str, index: str, tmp_path: Path, *extra: str):
    """probe, plan --simulate or train on `index`, as a user would type them."""
    argv = {
        "probe": ["probe", index],
        "plan": ["plan", "--shards", index, "--simulate", "--workers", "1", "--batch-size", "1"],
        "train": ["train", "--shards", index, *TINY_TRAIN, "--run-dir", str(tmp_path / "run")],
    }[command]
    return cli(*argv, *extra, timeout=90)


@pytest.mark.parametrize("command", ["probe", "plan", "train"])
def test_index_with_pipe_url_is_refused(command, hostile_dir, hostile_server, marker, tmp_path):
    size = two_sample_shard(hostile_dir / "x.tar")
    url = f"pipe:touch {marker} && cat {hostile_dir / 'x.tar'}"
    write_index(hostile_dir, [{"url": url, "nsamples": 2, "filesize": size}])
    index = f"{hostile_server.url}/shards.json"
    result = run_command(command, index, tmp_path)
    assert not marker.exists()
    refused(result, index, "split 'train' shard 0", "url 'pipe:touch", "--trust-index")


@pytest.mark.parametrize(
    "name",
    ["/{outside}/secret.tar", "file:///{outside}/secret.tar", "../secret.tar", "sub/../../secret.tar", "%2e%2e/x.tar"],
)
def test_index_naming_a_file_outside_its_folder_is_refused(name, hostile_dir, hostile_server, tmp_path):
    outside = tmp_path / "node-private"
    outside.mkdir()
    size = two_sample_shard(outside / "secret.tar")
    write_index(hostile_dir, [{"url": name.format(outside=str(outside).strip("/")), "nsamples": 2, "filesize": size}])
    index = f"{hostile_server.url}/shards.json"
    refused(cli("probe", index), index, "split 'train' shard 0", "--trust-index")


def test_index_naming_another_host_is_refused(hostile_dir, hostile_server, shard_server, digit_shards):
    first = json.loads((digit_shards / "shards.json").read_text())["splits"]["train"]["shardlist"][0]
    write_index(hostile_dir, [{**first, "url": f"{shard_server.url}/{first['url']}"}])
    index = f"{hostile_server.url}/shards.json"
    refused(cli("probe", index), index, "split 'train' shard 0", "names a scheme")


def test_trust_index_lets_the_operators_own_index_name_commands_with_a_warning(hostile_dir, hostile_server, tmp_path):
    size = two_sample_shard(tmp_path / "mine.tar")
    write_index(hostile_dir, [{"url": f"pipe:cat {tmp_path / 'mine.tar'}", "nsamples": 2, "filesize": size}])
    result = cli("probe", f"{hostile_server.url}/shards.json", "--trust-index")
    assert result.returncode == 0, result.stderr
    assert "2 train samples in 1 shards" in result.stdout
    assert "--trust-index" in result.stderr and "pipe:" in result.stderr


def test_train_urls_given_on_the_command_line_may_still_be_pipes(tmp_path):
    from imagenet_train.datasets.source import resolve_source

    source = resolve_source("", f"pipe:cat {tmp_path}/x.tar", "", 2, 2)
    assert source.train_urls == [f"pipe:cat {tmp_path}/x.tar"]


@pytest.fixture
def emulator():
    with gcs_emulator(BUCKET) as url:
        yield url


def test_index_in_a_bucket_with_pipe_url_is_refused(emulator, hostile_dir, marker):
    size = two_sample_shard(hostile_dir / "x.tar")
    write_index(hostile_dir, [{"url": f"pipe:touch {marker} && cat {hostile_dir / 'x.tar'}", "nsamples": 2}])
    index = f"gs://{BUCKET}/hostile/shards.json"
    gcs.upload(str(hostile_dir / "shards.json"), index)
    gcs.upload(str(hostile_dir / "x.tar"), f"gs://{BUCKET}/hostile/x.tar")
    assert size
    result = cli("probe", index)
    assert not marker.exists()
    refused(result, index, "split 'train' shard 0", "pipe:touch")


def test_index_larger_than_the_cap_is_refused_without_reading_it_all(hostile_dir, hostile_server):
    size = two_sample_shard(hostile_dir / "x.tar")
    write_index(hostile_dir, [{"url": "x.tar", "nsamples": 2, "filesize": size}], padding=(64 << 20) + 1)
    index = f"{hostile_server.url}/shards.json"
    refused(cli("probe", index), index, f"more than {64 << 20} bytes")


@pytest.mark.parametrize("command", ["plan", "train"])
def test_index_claiming_more_samples_than_its_shard_can_hold_is_refused(command, hostile_dir, hostile_server, tmp_path):
    size = two_sample_shard(hostile_dir / "x.tar")  # about 20 KB
    write_index(hostile_dir, [{"url": "x.tar", "nsamples": 10**12, "filesize": size}])
    index = f"{hostile_server.url}/shards.json"
    refused(run_command(command, index, tmp_path), index, "split 'train' shard 0", f"{10**12} samples cannot fit")


def test_index_claiming_absurd_samples_without_a_filesize_is_refused(hostile_dir, hostile_server, tmp_path):
    two_sample_shard(hostile_dir / "x.tar")
    write_index(hostile_dir, [{"url": "x.tar", "nsamples": 10**12}])
    index = f"{hostile_server.url}/shards.json"
    refused(run_command("train", index, tmp_path), index, "split 'train' shard 0", "nsamples: expected")


def test_plan_simulate_stops_at_a_shard_holding_fewer_samples_than_claimed(hostile_dir, hostile_server, tmp_path):
    two_sample_shard(hostile_dir / "x.tar")
    write_index(hostile_dir, [{"url": "x.tar", "nsamples": 1_000_000}])  # no filesize to check it against
    index = f"{hostile_server.url}/shards.json"
    result = run_command("plan", index, tmp_path)
    refused(result, hostile_server.url, "x.tar: holds 2 samples, the index says 1000000")
