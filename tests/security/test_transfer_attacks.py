"""Bucket object names chosen by whoever can write to the bucket: `sync`, the chart's `fill` and fetching a
run back for `train --resume latest --results gs://...` never write outside their destination."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.io import gcs
from imagenet_train.ops.serve import free_port

from conftest import SMALL_TRAIN, cli, local_service, write_image_folder

BUCKET = "hostile-names"

# (what the name does, object name relative to the synced prefix); the prefix also holds one good object.
HOSTILE = [
    ("climbs out", "../../x"),
    ("climbs out after a folder", "sub/../../../x"),
    ("empty segment", "a//x"),
    ("absolute", "/x"),
    ("dot segment", "./x"),
    ("backslashes", "..\\..\\x"),
    ("control character", "x\x07y"),
]


@pytest.fixture(scope="module")
def bucket():
    """A gs:// emulator on 127.0.0.1 that stores any object name, as GCS does (see gcs_any_names.py)."""
    port = free_port()
    command = [sys.executable, str(Path(__file__).with_name("gcs_any_names.py")), str(port), BUCKET]
    host = f"http://127.0.0.1:{port}"
    with local_service(command, f"{host}/storage/v1/b", {"STORAGE_EMULATOR_HOST": host}):
        gcs.client.cache_clear()
        yield f"gs://{BUCKET}"
    gcs.client.cache_clear()


def hostile_prefix(bucket: str, tmp_path: Path, name: str, prefix: str) -> str:
    """gs://BUCKET/<prefix> holding a good shard and the object `<prefix>/<name>`; returns its URL."""
    payload = tmp_path / "payload"
    payload.write_bytes(b"attacker's bytes\n")
    gcs.upload(str(payload), f"{bucket}/{prefix}/good.tar")
    gcs.upload(str(payload), f"{bucket}/{prefix}/{name}")
    return f"{bucket}/{prefix}"


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


def assert_refused_and_nothing_written(result, url: str, tmp_path: Path, before: list[str]) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("imagenet-train: error: "), result.stderr
    assert f"{url}: 1 object name(s) are not plain paths" in result.stderr
    assert files_under(tmp_path) == before  # not the good object either: the whole sync is refused


@pytest.mark.parametrize(("what", "name"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_sync_refuses_a_prefix_with_a_hostile_object_name(bucket, tmp_path, what, name):
    url = hostile_prefix(bucket, tmp_path, name, f"sync-{HOSTILE.index((what, name))}")
    before = files_under(tmp_path)
    result = cli("sync", url, str(tmp_path / "volume" / "shards"))
    assert_refused_and_nothing_written(result, url, tmp_path, before)
    assert repr(name) in result.stderr


def test_sync_does_not_follow_a_symlink_in_the_destination_out_of_it(bucket, tmp_path):
    url = hostile_prefix(bucket, tmp_path, "link/x", "through-link")
    outside = tmp_path / "outside"
    outside.mkdir()
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "link").symlink_to(outside)
    before = files_under(tmp_path)
    result = cli("sync", url, str(volume))
    assert_refused_and_nothing_written(result, url, tmp_path, before)
    assert list(outside.iterdir()) == []


def test_sync_dry_run_lists_every_refused_name(bucket, tmp_path):
    url = f"{bucket}/dry"
    payload = tmp_path / "payload"
    payload.write_bytes(b"x")
    for name in ("good.tar", "../x", "a//b"):
        gcs.upload(str(payload), f"{url}/{name}")
    result = cli("sync", url, str(tmp_path / "volume"), "--dry-run")
    assert result.returncode == 2
    assert "refuse 'gs://hostile-names/dry/../x': '..' segment" in result.stdout
    assert "refuse 'gs://hostile-names/dry/a//b': empty segment" in result.stdout
    assert f"{url}: 2 object name(s) are not plain paths" in result.stderr
    assert not (tmp_path / "volume").exists()


def test_the_charts_fill_pod_refuses_a_hostile_object_name(bucket, tmp_path):
    url = hostile_prefix(bucket, tmp_path, "../../x", "fill")
    deployment = tmp_path / "deployment.yaml"
    document = {
        "name": "r",
        "shards": {"server": "nginx", "nginx": {"fill": {"from": url, "parallel": 2}}},
        "gcp": {"credentialsSecret": ""},
    }
    deployment.write_text(yaml.safe_dump(document))
    before = files_under(tmp_path)
    result = cli("fill", "--deployment", str(deployment), "--directory", str(tmp_path / "volume" / "shards"))
    assert_refused_and_nothing_written(result, url, tmp_path, before)


def test_resume_from_a_results_bucket_refuses_a_hostile_object_name(bucket, tmp_path):
    write_image_folder(tmp_path / "images", {"n01": 4, "n02": 4}, {"n01": 1, "n02": 1})
    convert(str(tmp_path / "images"), str(tmp_path / "shards"), ShardOptions(), progress=False)
    url = hostile_prefix(bucket, tmp_path, "../../x", "runs/r1")
    before = files_under(tmp_path)
    run_dir = tmp_path / "deep" / "run"
    result = cli(
        "train",
        *SMALL_TRAIN,
        *("--shards", str(tmp_path / "shards" / "shards.json"), "--epochs", "1", "--batch-size", "4"),
        *("--run-dir", str(run_dir), "--results", url, "--resume", "latest"),
        timeout=240,
    )
    assert result.returncode == 2, result.stdout + result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith(f"imagenet-train: error: {url}: 1 object name(s)")
    assert not (tmp_path / "x").exists()
    assert [f for f in files_under(tmp_path) if not f.startswith("deep/run/")] == before
    assert not any(name.endswith(".pt") or name == "x" for name in files_under(run_dir))


@pytest.mark.unit
@pytest.mark.parametrize(("what", "name"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_object_names_that_are_not_plain_relative_paths_are_refused(what, name):
    from imagenet_train.io.paths import UnsafeName, relative_parts

    with pytest.raises(UnsafeName):
        relative_parts(name)


@pytest.mark.unit
def test_plain_object_names_become_their_segments():
    from imagenet_train.io.paths import relative_parts

    assert relative_parts("checkpoints/epoch-0000.pt") == ("checkpoints", "epoch-0000.pt")
    assert relative_parts("a..b/.hidden/x y.tar") == ("a..b", ".hidden", "x y.tar")


@pytest.mark.unit
def test_a_symlink_at_the_final_name_leading_out_is_refused(tmp_path):
    from imagenet_train.io.paths import UnsafeName, confined

    (tmp_path / "outside").write_text("secret")
    volume = tmp_path / "volume"
    (volume / "inner").mkdir(parents=True)
    (volume / "leak").symlink_to(tmp_path / "outside")
    (volume / "alias").symlink_to(volume / "inner")
    with pytest.raises(UnsafeName):
        confined(str(volume), str(volume / "leak"))
    assert confined(str(volume), str(volume / "alias" / "x")) == str(volume / "alias" / "x")
