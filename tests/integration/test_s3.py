"""s3:// through boto3 against a real S3 API server (moto's) started on 127.0.0.1 by the test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from imagenet_train.datasets.source import resolve_source
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import s3, storage
from imagenet_train.io.resumable import ResumableReader
from imagenet_train.loading.presets import ValPreset
from imagenet_train.loading.stream import EpochLoader, ShardStream
from imagenet_train.ops.serve import free_port

from conftest import cli, local_service

BUCKET = "imagenet-train-s3"


@pytest.fixture(scope="module")
def s3_server():
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    settings = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    command = [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)]
    with local_service(command, endpoint, settings):
        s3.client.cache_clear()
        yield endpoint
    s3.client.cache_clear()


@pytest.fixture(scope="module")
def s3_shards(s3_server, digit_shards):
    client = s3.client()
    client.create_bucket(Bucket=BUCKET)
    for path in digit_shards.iterdir():
        client.upload_file(str(path), BUCKET, f"shards/{path.name}")
    return f"s3://{BUCKET}/shards"


def test_loader_streams_s3_shards_natively_with_workers(s3_shards):
    source = resolve_source(f"{s3_shards}/shards.json")
    assert source.val_urls[0].startswith(f"{s3_shards}/")
    stream = ShardStream(urls=source.val_urls, transform=ValPreset(24, 24).build(), batch_size=32)
    loader = EpochLoader(stream, workers=2)
    assert sum(len(keys) for _, _, keys in loader) == 359 and loader.corrupt_samples == 0


def test_probe_reads_an_s3_index_and_shard_from_the_cli(s3_shards):
    result = cli("probe", f"{s3_shards}/shards.json")
    assert result.returncode == 0, result.stderr
    assert "1438 train samples in 12 shards" in result.stdout


def test_a_read_broken_midway_resumes_with_a_range_request(s3_shards, digit_shards):
    name = sorted(p.name for p in digit_shards.glob("*.tar"))[0]
    expected = (digit_shards / name).read_bytes()
    stream = ResumableReader(f"{s3_shards}/{name}", s3.opener(f"{s3_shards}/{name}"), budget=30)
    body = stream.opened.body.body  # boto3's StreamingBody inside the outage-sorting wrapper
    original, calls = body.read, {"n": 0}

    def flaky(size=-1):
        calls["n"] += 1
        if calls["n"] == 3:  # after two good reads: the connection drops
            raise ConnectionResetError("connection reset by peer")
        return original(size)

    body.read = flaky
    data, buffer = bytearray(), bytearray(4096)
    while count := stream.readinto(buffer):
        data += buffer[:count]
    assert calls["n"] == 3  # the reopened body (a Range request from byte 8192) read the rest
    assert bytes(data) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (f"s3://{BUCKET}/nothing/here.tar", "no such object"),
        ("s3://no-such-bucket-x/a.tar", "no such bucket"),
        ("s3://just-a-bucket", "expected s3://BUCKET/KEY"),
    ],
)
def test_s3_errors_name_the_url_in_one_line(s3_shards, url, message):
    with pytest.raises(ImagenetTrainError, match=message) as caught:
        storage.read_bytes(url)
    assert url in str(caught.value) and "\n" not in str(caught.value)
