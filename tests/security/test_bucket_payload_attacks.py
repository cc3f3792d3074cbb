"""What a bucket sends back, chosen by whoever can write to it: an object stored with `Content-Encoding: gzip`
(GCS inflates it on the way, to any size), bytes past the listed size; and a full local disk under `sync`,
which is this machine's fault and never a bucket outage to wait out. The server is gcp-storage-emulator on
127.0.0.1, made to transcode as GCS does (gcs_transcoding.py); the disk is a real tmpfs mounted with size=."""

from __future__ import annotations

import gzip
import sys
import time
from pathlib import Path

import pytest
from faults.injectors import small_tmpfs

from imagenet_train.io import gcs, s3, storage
from imagenet_train.ops.serve import free_port

from conftest import cli, local_service

BUCKET = "transcoding"
INFLATED = 64 << 20  # what the gzip object below inflates to, from ~64 KB stored


@pytest.fixture(scope="module")
def bucket():
    """gs:// on a gcp-storage-emulator on 127.0.0.1 that serves gzip-encoded objects as GCS does."""
    port = free_port()
    command = [sys.executable, str(Path(__file__).with_name("gcs_transcoding.py")), str(port), BUCKET]
    host = f"http://127.0.0.1:{port}"
    with local_service(command, f"{host}/storage/v1/b", {"STORAGE_EMULATOR_HOST": host}):
        gcs.client.cache_clear()
        yield f"gs://{BUCKET}"
    gcs.client.cache_clear()


def _put(name: str, data: bytes, encoding: str | None = None) -> None:
    blob = gcs.client().bucket(BUCKET).blob(name)
    blob.content_encoding = encoding
    blob.upload_from_string(data, content_type="application/octet-stream")


def _one_line(result, *fragments: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("imagenet-train: error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    return result.stderr


def test_sync_writes_a_gzip_encoded_object_as_stored_never_inflated(bucket, tmp_path):
    stored = gzip.compress(b"\0" * INFLATED)
    _put("bomb/shards.tar", stored, encoding="gzip")
    _put("bomb/index.json", b"{}")
    result = cli("sync", f"{bucket}/bomb", str(tmp_path / "out"), "--io-timeout", "5")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "shards.tar").read_bytes() == stored  # the stored bytes, checksum verified


def test_sync_refuses_an_object_longer_than_listed_at_the_listed_size(bucket, tmp_path):
    _put("long/a.longer", b"x" * 1000)  # served with a megabyte more than the listing says
    result = cli("sync", f"{bucket}/long", str(tmp_path / "out"), "--io-timeout", "5")
    _one_line(result, f"{bucket}/long/a.longer", "more than the 1000 bytes it lists")
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()], "a partial file was left behind"


def test_sync_into_a_full_disk_is_a_local_error_at_once_not_an_outage(bucket, tmp_path):
    _put("big/shard-0.tar", b"\1" * (3 << 20))
    with small_tmpfs(tmp_path / "small", 1) as mount:
        started = time.monotonic()
        result = cli("sync", f"{bucket}/big", str(mount / "out"), "--io-timeout", "60")
        seconds = time.monotonic() - started
        assert not [p for p in mount.rglob("*") if p.is_file()], "a partial file was left behind"
    line = _one_line(result, str(mount / "out" / "shard-0.tar"), "No space left on device", "MB free on")
    assert "unreachable" not in line
    assert seconds < 20, f"took {seconds:.0f} s: waited as if the bucket were down"


def test_an_s3_object_stored_gzip_encoded_is_read_as_stored():
    """moto on 127.0.0.1: boto3 hands over the stored bytes, bounded by the announced length."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    settings = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    command = [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)]
    stored = gzip.compress(b"\0" * INFLATED)
    with local_service(command, endpoint, settings):
        s3.client.cache_clear()
        try:
            s3.client().create_bucket(Bucket="gzip-encoded")
            s3.client().put_object(Bucket="gzip-encoded", Key="a.tar", Body=stored, ContentEncoding="gzip")
            assert storage.read_bytes("s3://gzip-encoded/a.tar", io_timeout=5) == stored
        finally:
            s3.client.cache_clear()
