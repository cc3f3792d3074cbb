"""Buckets: gs:// through google-cloud-storage against a real gcp-storage-emulator on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from imagenet_train.datasets.source import resolve_source
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import gcs, storage, transfer
from imagenet_train.loading.presets import ValPreset
from imagenet_train.loading.stages import ShardReading
from imagenet_train.loading.stream import EpochLoader, ShardStream

from conftest import REPO, SMALL_TRAIN, cli, gcs_emulator, read_metrics, torchrun

BUCKET = "imagenet-train-test"


@pytest.fixture(scope="module")
def emulator():
    with gcs_emulator(BUCKET) as url:
        yield url


@pytest.fixture(scope="module")
def gs_shards(emulator, digit_shards):
    url = f"gs://{BUCKET}/shards"
    result = cli("upload", str(digit_shards), url)
    assert result.returncode == 0, result.stderr
    return url


def test_round_trip_of_small_and_large_files_is_verified(emulator, tmp_path):
    small, large = tmp_path / "small.bin", tmp_path / "large.bin"
    small.write_bytes(b"x" * 100)
    large.write_bytes(os.urandom(52 * 1024 * 1024))  # several resumable-upload chunks
    for path in (small, large):
        info = gcs.upload(str(path), f"gs://{BUCKET}/rt/{path.name}")
        assert info.size == path.stat().st_size and info.crc32c == gcs.file_crc32c(str(path))
        back = tmp_path / f"back-{path.name}"
        gcs.download(f"gs://{BUCKET}/rt/{path.name}", str(back))
        assert back.read_bytes() == path.read_bytes()
    assert sorted(o.name for o in gcs.listing(f"gs://{BUCKET}/rt/")) == ["rt/large.bin", "rt/small.bin"]


def test_upload_skips_identical_files_and_sync_brings_them_back(gs_shards, digit_shards, tmp_path):
    files = len(list(digit_shards.iterdir()))
    again = cli("upload", str(digit_shards), gs_shards)
    assert "uploaded and verified 0 files" in again.stdout and f"{files} already there" in again.stdout
    changed = tmp_path / "run"
    changed.mkdir()
    (changed / "metrics.jsonl").write_text("{}\n")
    cli("upload", str(changed), f"gs://{BUCKET}/runs/x")
    (changed / "metrics.jsonl").write_text('{"epoch": 1}\n')
    dry = cli("upload", str(changed), f"gs://{BUCKET}/runs/x", "--dry-run")
    assert "copy " in dry.stdout and "would copy 1 files" in dry.stdout
    synced = cli("sync", gs_shards, str(tmp_path / "copy"))
    assert synced.returncode == 0 and f"downloaded and verified {files} files" in synced.stdout
    for path in digit_shards.iterdir():
        assert (tmp_path / "copy" / path.name).read_bytes() == path.read_bytes()


def test_the_charts_fill_pod_copies_the_bucket_named_in_its_rendered_config(gs_shards, digit_shards, tmp_path):
    import yaml

    from chartkit.objects import render

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"shards": {"nginx": {"fill": {"enabled": True, "from": gs_shards}}}}))
    objects = [o for o in yaml.safe_load_all(render([str(values)], release="r")) if o]
    config = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-config"))
    fill = next(o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].endswith("-fill"))
    args = fill["spec"]["template"]["spec"]["containers"][0]["args"]
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text(config["data"]["deployment.yaml"])
    args = [str(deployment) if a == "/etc/imagenet-train/deployment.yaml" else a for a in args]
    result = cli(*args, "--directory", str(tmp_path / "volume"))
    assert result.returncode == 0, result.stderr
    for path in digit_shards.iterdir():
        assert (tmp_path / "volume" / path.name).read_bytes() == path.read_bytes()


@contextlib.contextmanager
def read_only_directory(path: Path):
    """A directory nothing can write, like a path on a pod's read-only root filesystem."""
    path.mkdir()
    if os.geteuid() != 0:  # permissions bind a normal user; root needs a read-only mount
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_a_checkpoint_upload_in_a_chart_pod_writes_only_under_its_volumes(emulator, tmp_path):
    """32 MiB and more go up as resumable sessions whose record used to land in ~/.cache: on the chart's
    read-only root that upload failed. The pod's environment now points every such path at a volume."""
    import yaml

    from chartkit.objects import render
    from imagenet_train.deployment import WRITABLE_ENV, pod_environment, read_deployment

    checkpoint = tmp_path / "run" / "checkpoint.pt"
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(os.urandom(40 * 1024 * 1024))
    url = f"gs://{BUCKET}/pods"
    with read_only_directory(tmp_path / "home") as home:
        bare = {k: v for k, v in os.environ.items() if k not in WRITABLE_ENV} | {"HOME": str(home)}
        before = subprocess.run(
            [sys.executable, "-m", "imagenet_train.cli", "upload", str(checkpoint.parent), url],
            env=bare,
            capture_output=True,
            text=True,
        )
        assert before.returncode == 2, before.stderr  # at once: a read-only disk is not an outage to wait out
        sessions = f"{home}/.cache/imagenet-train/uploads"
        assert before.stderr == (
            f"imagenet-train: error: upload sessions folder {sessions}: cannot make or read (Read-only file system)\n"
        )
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump({"results": {"bucket": f"gs://{BUCKET}/runs"}}))
        config = next(
            o for o in yaml.safe_load_all(render([str(values)], release="r")) if o and o["kind"] == "ConfigMap"
        )
        pod = pod_environment(read_deployment(yaml.safe_load(config["data"]["deployment.yaml"])), bare)
        volumes = {"/tmp": tmp_path / "scratch", "/results": tmp_path / "results"}  # the pod's emptyDirs, here
        for name in WRITABLE_ENV:
            mount = next(m for m in volumes if pod[name] == m or pod[name].startswith(m + "/"))
            pod[name] = str(volumes[mount]) + pod[name][len(mount) :]
        after = subprocess.run(
            [sys.executable, "-m", "imagenet_train.cli", "upload", str(checkpoint.parent), url],
            env=pod,
            capture_output=True,
            text=True,
        )
        assert after.returncode == 0, after.stderr
    assert gcs.file_crc32c(str(checkpoint)) == gcs.stat(f"{url}/checkpoint.pt").crc32c
    assert list((tmp_path / "results" / ".upload-sessions").iterdir()) == []  # the finished session is gone


def test_a_checksum_mismatch_after_upload_is_an_error(emulator, tmp_path, monkeypatch):
    path = tmp_path / "a.bin"
    path.write_bytes(b"abc" * 1000)
    real = gcs.file_crc32c
    monkeypatch.setattr(gcs, "file_crc32c", lambda p: "AAAAAA==" if p == str(path) else real(p))
    with pytest.raises(ImagenetTrainError, match="stored checksum .* differs"):
        gcs.upload(str(path), f"gs://{BUCKET}/mismatch/a.bin")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (f"gs://{BUCKET}/nothing/here.tar", "no such object"),
        ("gs://no-such-bucket-x/a.tar", "no such bucket"),
        ("gs://", "expected gs://BUCKET/PATH"),
    ],
)
def test_bucket_errors_name_the_url(emulator, url, message):
    with pytest.raises(ImagenetTrainError, match=message) as caught:
        storage.open_stream(url, io_timeout=0)
    assert url in str(caught.value)


def test_loader_streams_shards_natively_from_gs(gs_shards):
    source = resolve_source(f"{gs_shards}/shards.json")
    assert source.val_urls[0].startswith(f"{gs_shards}/imagenet-train-val-")
    stream = ShardStream(urls=source.val_urls, transform=ValPreset(24, 24).build(), batch_size=32)
    keys = Counter(k for _, _, batch in EpochLoader(stream, workers=2) for k in batch)
    assert len(keys) == 359 and set(keys.values()) == {1}


def test_ddp_training_reads_gs_shards_writes_results_and_resumes_from_the_bucket(gs_shards, tmp_path):
    results = f"gs://{BUCKET}/runs/ddp"
    args = [
        "--shards",
        f"{gs_shards}/shards.json",
        "--results",
        results,
        "--epoch-batches",
        "4",
        *SMALL_TRAIN,
        "--batch-size",
        "16",
    ]
    first = torchrun([*args, "--run-dir", str(tmp_path / "a"), "--epochs", "1"])
    assert first.returncode == 0, first.stderr[-3000:]
    names = {o.name for o in gcs.listing(results + "/")}
    assert {"runs/ddp/config.json", "runs/ddp/metrics.jsonl", "runs/ddp/checkpoints/epoch-0000.pt"} <= names
    # A new machine: empty run directory, everything comes back from the bucket.
    second = torchrun([*args, "--run-dir", str(tmp_path / "b"), "--epochs", "2", "--resume", "latest"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert "continuing at epoch 1" in second.stdout
    assert [m["epoch"] for m in read_metrics(tmp_path / "b")] == [0, 1]


def test_shards_are_written_straight_to_a_bucket(emulator, tmp_path):
    from conftest import write_image_folder

    write_image_folder(tmp_path / "in", {"n01": 4, "n02": 4}, {"n01": 1, "n02": 1})
    url = f"gs://{BUCKET}/converted"
    result = cli("shards", str(tmp_path / "in"), url, "--maxcount", "3", "--quiet", "--staging", str(tmp_path / "s"))
    assert result.returncode == 0, result.stderr
    assert f"index: {url}/shards.json" in result.stdout
    summary = cli("summarize", url)
    assert "train: 8 samples in 3 shards" in summary.stdout


def test_node_local_cache_serves_the_second_epoch_from_disk(gs_shards, tmp_path):
    source = resolve_source(f"{gs_shards}/shards.json")
    cache = tmp_path / "cache"

    def epoch_keys():
        stream = ShardStream(
            urls=source.val_urls,
            transform=ValPreset(24, 24).build(),
            batch_size=32,
            reading=ShardReading(io_timeout=0, cache_dir=str(cache)),
        )
        return sorted(k for _, _, batch in EpochLoader(stream, workers=0) for k in batch)

    first = epoch_keys()
    cached = sorted(p.name for p in cache.iterdir())
    assert len(cached) == len(source.val_urls) and not any(".part" in name for name in cached)
    os.environ["STORAGE_EMULATOR_HOST"], saved = "http://127.0.0.1:9", os.environ["STORAGE_EMULATOR_HOST"]
    gcs.client.cache_clear()
    try:
        assert epoch_keys() == first  # the bucket is unreachable now: every byte came from the cache
    finally:
        os.environ["STORAGE_EMULATOR_HOST"] = saved
        gcs.client.cache_clear()


def test_results_uploader_mirrors_changes_and_reports_a_missing_bucket(emulator, tmp_path):
    from imagenet_train.rundir.results_mirror import ResultsUploader

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"epoch": 0}\n')
    uploader = ResultsUploader(run_dir, f"gs://{BUCKET}/mirror")
    uploader.sync()
    (run_dir / "checkpoints" / "epoch-0000.pt").write_bytes(b"weights")
    assert uploader.finish(timeout=60) == []
    assert sorted(o.name for o in gcs.listing(f"gs://{BUCKET}/mirror/")) == [
        "mirror/checkpoints/epoch-0000.pt",
        "mirror/metrics.jsonl",
    ]
    broken = ResultsUploader(run_dir, "gs://no-such-bucket-y/run", io_timeout=5)
    broken.sync()
    assert broken.finish(timeout=30) == ["metrics.jsonl", "checkpoints/epoch-0000.pt"]  # named, not raised


def test_a_resume_keeps_every_epochs_line_from_the_bucket_and_from_this_node(emulator, tmp_path):
    """The bucket lags this node (its last line not uploaded yet), and this node can lag the bucket (rank 0 ran on
    another node meanwhile): after the fetch, metrics.jsonl holds every epoch either had, once, in order."""
    from imagenet_train.rundir.results_mirror import fetch_for_resume

    url = f"gs://{BUCKET}/merge"
    bucket = tmp_path / "bucket"
    (bucket / "checkpoints").mkdir(parents=True)
    (bucket / "metrics.jsonl").write_text('{"epoch": 0, "top1": 0.1}\n{"epoch": 2, "top1": 0.3}\n')
    (bucket / "checkpoints" / "epoch-0002.pt").write_bytes(b"weights")
    transfer.upload_tree(str(bucket), url)
    here = tmp_path / "run"
    here.mkdir()
    (here / "metrics.jsonl").write_text('{"epoch": 0, "top1": 0.1}\n{"epoch": 1, "top1": 0.2}\n')
    assert fetch_for_resume(url, here) == 2  # the bucket's checkpoint and its metrics.jsonl
    assert [json.loads(line)["top1"] for line in (here / "metrics.jsonl").read_text().splitlines()] == [0.1, 0.2, 0.3]


def test_a_node_that_fetched_a_run_never_uploads_its_stale_copy_over_rank_0s_newer_files(emulator, tmp_path):
    """Every node fetches the run to resume, and every node mirrors what it writes (its ranks' key logs); only rank
    0 writes metrics.jsonl. Another node's fetched copy must not replace rank 0's newer one in the bucket."""
    from imagenet_train.rundir.results_mirror import ResultsMirror

    url = f"gs://{BUCKET}/two-nodes"
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    (bucket / "metrics.jsonl").write_text('{"epoch": 0}\n')
    transfer.upload_tree(str(bucket), url)
    other_node = ResultsMirror(tmp_path / "node1", url, io_timeout=30, local_rank=0)
    other_node.fetch_for_resume(say=False)
    (bucket / "metrics.jsonl").write_text('{"epoch": 0}\n{"epoch": 1}\n')  # rank 0, on its node, after epoch 1
    gcs.upload(str(bucket / "metrics.jsonl"), f"{url}/metrics.jsonl")
    (tmp_path / "node1" / "rank-0001.keys").write_text("0 a b\n")  # this node's own file
    other_node.sync()
    other_node.finish(timeout=60)
    assert gcs.stat(f"{url}/metrics.jsonl").size == (bucket / "metrics.jsonl").stat().st_size
    assert gcs.stat(f"{url}/rank-0001.keys") is not None


def test_an_upload_killed_midway_resumes_from_the_last_chunk_in_a_new_process(emulator, tmp_path):
    """SIGKILL `imagenet-train upload` of a 60 MB file after a few chunks; the next run continues, not restarts."""
    source = tmp_path / "run"
    source.mkdir()
    payload = os.urandom(60 * 1024 * 1024)
    (source / "big.pt").write_bytes(payload)
    sessions = tmp_path / "sessions"
    env = {
        **os.environ,
        "IMAGENET_TRAIN_UPLOAD_SESSIONS": str(sessions),
        "IMAGENET_TRAIN_GCS_CHUNK": str(256 * 1024),  # many small chunks: time to interrupt it
    }
    url = f"gs://{BUCKET}/resume"
    command = [str(Path(sys.executable).with_name("imagenet-train")), "upload", str(source), url, "--workers", "1"]
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    committed = 0
    deadline = time.monotonic() + 60
    while committed < 8 * 1024 * 1024 and time.monotonic() < deadline and first.poll() is None:
        for record in sessions.glob("*.json"):
            with contextlib.suppress(json.JSONDecodeError, FileNotFoundError):  # mid-rename
                committed = json.loads(record.read_text()).get("committed", 0)
        time.sleep(0.01)
    first.kill()
    first.wait()
    assert first.returncode == -9, f"the first upload was not interrupted: {first.communicate()}"
    assert 0 < committed < len(payload)
    assert gcs.stat(f"{url}/big.pt") is None  # nothing that looks complete

    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    resumed_at = int(second.stdout.split("resuming an interrupted upload at ")[1].split()[0])
    assert resumed_at >= committed
    assert storage.read_bytes(f"{url}/big.pt") == payload
    assert not list(sessions.glob("*.json"))  # the session record is gone once the object is complete


def test_tools_upload_is_the_same_upload_for_operators(emulator, digit_shards, tmp_path):
    script = [sys.executable, str(REPO / "tools" / "upload.py")]
    url = f"gs://{BUCKET}/tool-upload"
    dry = subprocess.run([*script, str(digit_shards), url, "--dry-run"], capture_output=True, text=True)
    assert dry.returncode == 0 and "would copy" in dry.stdout and gcs.listing(url + "/") == []
    done = subprocess.run([*script, str(digit_shards), url], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    again = subprocess.run([*script, str(digit_shards), url], capture_output=True, text=True)
    count = len(list(digit_shards.iterdir()))
    assert f"0 files (0.0 MB), {count} already there with the same checksum" in again.stdout, again.stdout
    assert len(gcs.listing(url + "/")) == len(list(digit_shards.iterdir()))
    bad = subprocess.run([*script, str(digit_shards), "s3://elsewhere"], capture_output=True, text=True)
    assert bad.returncode == 2 and "s3://elsewhere" in bad.stderr and bad.stderr.count("\n") == 1
