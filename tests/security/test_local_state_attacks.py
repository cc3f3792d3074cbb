"""The data plane's second surface, on this machine: compressed checkpoints and bucket objects that inflate,
a full local disk taken for a bucket outage, a cache folder planted by another local user (`nobody`, run
through runuser), and a key log forged through tar member names."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.cache import cache_path
from imagenet_train.loading.stages import ShardReading, samples_in_tar
from imagenet_train.planning.position import Position
from imagenet_train.rundir import checkpoint
from imagenet_train.rundir.directory import KeyLog, consumed_keys
from security.test_state_attacks import _as_nobody, nobody_python  # noqa: F401 (a fixture: Python nobody may run)


def _shard(path: Path, keys: list[str]) -> Path:
    """A real tar shard with a .jpg and a .cls member per key (names written byte for byte, GNU format)."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape") as tar:
        for index, key in enumerate(keys):
            for extension, data in (("jpg", b"\xff\xd8jpeg\xff\xd9"), ("cls", str(index % 10).encode())):
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


# -- the key log -----------------------------------------------------------------------------------------
HOSTILE_KEYS = [
    "s0000",
    "s0001\n0 s0004 s0005",  # a newline: the rest would be a line of its own, naming batch 0
    "s0002 s0006",  # a space: would read as two keys
    "s0003-\udcff\udcfe",  # bytes that are not UTF-8
    "s0004",
    "s0005",
    "s0006",
    "s0007",
]


def test_member_names_cannot_forge_or_split_key_log_lines(tmp_path):
    shard = _shard(tmp_path / "hostile.tar", HOSTILE_KEYS)
    with open(shard, "rb") as stream:
        keys = [sample["__key__"] for sample in samples_in_tar(stream, str(shard))]
    assert keys == HOSTILE_KEYS  # the reader gives the names as the tar holds them
    log = KeyLog(tmp_path / "run", epoch=0, rank=0, start=0)
    log.fetched(0, keys[:4])  # trained before the checkpoint at step 1
    log.fetched(1, keys[4:])  # fetched, but its step never ran
    log.close()
    consumed = consumed_keys(tmp_path / "run", Position(epoch=0, step=1, world=1))
    # Exactly batch 0's keys: none of batch 1's samples is skipped on the resume, none of batch 0's trained again.
    assert consumed == set(keys[:4])


def test_a_resume_trusts_only_whole_well_formed_key_log_lines(tmp_path):
    log = KeyLog(tmp_path / "run", epoch=0, rank=0, start=0)
    log.fetched(0, ["a", "b c"])
    log.close()
    path = next((tmp_path / "run" / "position" / "epoch-0000").iterdir())
    with open(path, "a") as stream:  # hand-made lines: raw text, a bad escape, a torn last line
        stream.write("0 plain\tkey\n0 bad%zz\n0 x\ny\n0 torn")
    assert consumed_keys(tmp_path / "run", Position(epoch=0, step=1, world=1)) == {"a", "b c", "x"}


# -- the shard cache -----------------------------------------------------------------------------------------
PLANT_CACHE = """
import os, sys
os.umask(0)
os.mkdir(sys.argv[1], 0o777)
with open(sys.argv[2], "wb") as stream:
    stream.write(open(sys.argv[3], "rb").read())
print("planted")
"""


@pytest.fixture
def shared_folder() -> Path:
    """A folder like /tmp (world-writable, sticky) that `nobody` can reach."""
    folder = Path(tempfile.mkdtemp(prefix="imagenet-train-test-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _keys(stream) -> list[str]:
    with stream:
        return [sample["__key__"] for sample in samples_in_tar(stream, "shard")]


def test_a_cache_folder_planted_by_another_user_is_refused(
    nobody_python,  # noqa: F811
    shared_folder,
    hostile_dir,
    hostile_server,
):
    _shard(hostile_dir / "train-0000.tar", ["real0", "real1"])
    url = f"{hostile_server.url}/train-0000.tar"
    cache, planted = shared_folder / "cache", shared_folder / "planted.tar"
    _shard(planted, ["planted0", "planted1"])
    planted.chmod(0o644)
    assert _as_nobody(nobody_python, PLANT_CACHE, str(cache), cache_path(str(cache), url), str(planted)) == "planted\n"
    reading = ShardReading(cache_dir=str(cache), verify=False)
    with pytest.raises(ImagenetTrainError, match=f"--cache-dir {cache}: owned by uid .*refused"):
        _keys(reading.open(url))


def test_a_world_writable_cache_folder_of_root_gets_a_private_folder_inside(hostile_dir, hostile_server, tmp_path):
    _shard(hostile_dir / "train-0000.tar", ["real0", "real1"])
    url = f"{hostile_server.url}/train-0000.tar"
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)  # as a pod's emptyDir is
    _shard(Path(cache_path(str(cache), url)), ["planted0"])  # anyone could have put this here
    reading = ShardReading(cache_dir=str(cache), verify=False)
    assert _keys(reading.open(url)) == ["real0", "real1"]
    private = cache / f"imagenet-train-{os.geteuid()}"
    assert private.stat().st_mode & 0o777 == 0o700
    assert _keys(reading.open(url)) == ["real0", "real1"]  # now from the private copy
    assert Path(cache_path(str(private), url)).is_file()


# -- a checkpoint that inflates ----------------------------------------------------------------------------
INFLATED_FLOATS = 32 << 20  # a 128 MB tensor, ~130 KB once deflated


def _deflated_checkpoint(path: Path) -> None:
    """A checkpoint of this program's shape whose tensor record is deflated: ~0.2 MB on disk, 128 MB loaded."""
    plain = path.with_suffix(".stored")
    # calloc'd zeros: the pages are not touched until written out, so this process does not hold 256 MB.
    state = {"epoch": 0, "model": {"w": torch.zeros(INFLATED_FLOATS)}, "optimizer": {}, "scaler": {}}
    torch.save(state, plain)
    del state
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(path, "w", compresslevel=1) as target:
        for record in source.infolist():
            info = zipfile.ZipInfo(record.filename)
            info.compress_type = zipfile.ZIP_DEFLATED if record.file_size > 1 << 20 else zipfile.ZIP_STORED
            with source.open(record) as read, target.open(info, "w", force_zip64=True) as write:
                shutil.copyfileobj(read, write, 1 << 20)
    plain.unlink()


# Loads the checkpoint the way --resume does; prints the outcome, and the peak RSS in MB before and after.
LOAD_MEASURED = """
import resource, sys
from pathlib import Path
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.rundir import checkpoint
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
try:
    checkpoint.load(Path(sys.argv[1]))
    print("loaded")
except ImagenetTrainError as error:
    print("error:", error)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def _load_measured(path: Path) -> tuple[str, int, int]:
    result = subprocess.run(
        [sys.executable, "-c", LOAD_MEASURED, str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    before, outcome, after = result.stdout.strip().splitlines()
    return outcome, int(before), int(after)


def test_a_checkpoint_with_a_compressed_record_is_refused_before_it_inflates(tmp_path):
    path = tmp_path / "run" / "checkpoints" / "epoch-0000.pt"
    path.parent.mkdir(parents=True)
    _deflated_checkpoint(path)
    assert path.stat().st_size < 2 << 20
    outcome, before, after = _load_measured(path)
    assert outcome.startswith(f"error: {path}: checkpoint record ") and "stored compressed" in outcome, outcome
    assert after < before + 32, f"peak RSS went from {before} MB to {after} MB"


def test_torch_writes_every_checkpoint_record_stored_and_such_checkpoints_load(tmp_path):
    path = tmp_path / "epoch-0000.pt"
    checkpoint.save({"epoch": 0, "model": {"w": torch.ones(3, 4)}, "optimizer": {}, "scaler": {}}, path)
    with zipfile.ZipFile(path) as archive:
        assert {record.compress_type for record in archive.infolist()} == {zipfile.ZIP_STORED}
    assert torch.equal(checkpoint.load(path)["model"]["w"], torch.ones(3, 4))


def test_a_checkpoint_in_the_legacy_format_is_refused_unloaded(tmp_path):
    # Its pickle declares each storage's size, and torch allocates that before reading the bytes.
    path = tmp_path / "epoch-0000.pt"
    state = {"epoch": 0, "model": {"w": torch.ones(2)}, "optimizer": {}, "scaler": {}}
    torch.save(state, path, _use_new_zipfile_serialization=False)
    with pytest.raises(ImagenetTrainError, match=r"epoch-0000.pt: a checkpoint in torch's legacy .*refused"):
        checkpoint.load(path)
