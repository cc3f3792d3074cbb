"""Attacks on the state a run keeps: a crafted checkpoint (run directory or results bucket), files another
local user plants where the loaders' per-epoch state or the I/O-wait stamp would be written, and what a run
leaves behind in $TMPDIR. The second local user is `nobody`, run through runuser."""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from integration.test_gcs import BUCKET, emulator  # noqa: F401 (a fixture: a real gcp-storage-emulator)

from imagenet_train.datasets.source import resolve_source
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import resumable
from imagenet_train.loading.epochstate import EpochState, EpochStateFile, read_epoch_state
from imagenet_train.loading.presets import ValPreset
from imagenet_train.loading.stream import EpochLoader, ShardStream

from conftest import SMALL_TRAIN, cli

TRAIN = [*SMALL_TRAIN, "--epochs", "1", "--epoch-batches", "2", "--eval-every", "5"]


class _Touch:
    """Unpickled, it creates the file at `path`: what a crafted pickle would do with any code it likes."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _crafted_checkpoint(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": 0, "model": _Touch(marker), "optimizer": {}, "scaler": {}}, path)


def _assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("imagenet-train: error: ") and "Traceback" not in result.stderr, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[-1]


# -- 1. a crafted checkpoint --------------------------------------------------------------------------
def test_a_crafted_checkpoint_in_the_run_directory_is_refused_unread(digit_shards, tmp_path, marker):
    run_dir = tmp_path / "run"
    _crafted_checkpoint(run_dir / "checkpoints" / "epoch-0001.pt", marker)
    result = cli("train", "--shards", str(digit_shards), "--run-dir", str(run_dir), *TRAIN, "--resume", "latest")
    assert not marker.exists(), "the checkpoint's pickle ran code"
    _assert_one_line_error(result, "epoch-0001.pt", "Python objects", "weights_only=False")


def test_a_crafted_checkpoint_in_the_results_bucket_is_refused_unread(emulator, digit_shards, tmp_path, marker):  # noqa: F811
    planted = tmp_path / "planted"
    _crafted_checkpoint(planted / "checkpoints" / "epoch-0001.pt", marker)
    results = f"gs://{BUCKET}/runs/crafted"
    assert cli("upload", str(planted), results).returncode == 0
    run_dir = tmp_path / "run"
    args = ["--shards", str(digit_shards), "--run-dir", str(run_dir), "--results", results, *TRAIN]
    result = cli("train", *args, "--resume", "latest")
    assert (run_dir / "checkpoints" / "epoch-0001.pt").is_file(), "the resume did not fetch from the bucket"
    assert not marker.exists(), "the checkpoint's pickle ran code"
    _assert_one_line_error(result, "epoch-0001.pt", "Python objects", "weights_only=False")


# -- 2. the loaders' per-epoch state, attacked by another local user ---------------------------------------
@pytest.fixture(scope="session")
def nobody_python() -> str:
    """A Python interpreter the user `nobody` may run (this venv's may sit under a private home)."""
    if os.geteuid() != 0 or not shutil.which("runuser"):
        pytest.skip("acting as a second local user needs root and runuser")
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        probe = subprocess.run(["runuser", "-u", "nobody", "--", candidate, "-c", "pass"], capture_output=True)
        if probe.returncode == 0:
            return candidate
    pytest.skip("no Python interpreter that nobody may run")


@pytest.fixture
def shared_tmp(tmp_path, monkeypatch) -> Path:
    """A folder like /tmp (world-writable, sticky) as this process's TMPDIR, which nobody can reach.

    (After tmp_path: pytest makes its own base folder under the TMPDIR it first sees.)"""
    folder = Path(tempfile.mkdtemp(prefix="imagenet-train-test-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _as_nobody(python: str, code: str, *args: str) -> str:
    result = subprocess.run(
        ["runuser", "-u", "nobody", "--", python, "-c", code, *args], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


# Writes a pickle that would touch the marker, at each path given, as a file nobody owns and anyone may
# write; prints per path whether it could.
PLANT_PICKLE = """
import os, pickle, sys
class Touch:
    def __reduce__(self):
        return (open, (sys.argv[1], "w"))
os.umask(0)
for path in sys.argv[2:]:
    try:
        with open(path, "wb") as stream:
            pickle.dump(Touch(), stream)
        print("wrote", path)
    except OSError as error:
        print("denied", path, error.strerror)
"""

PLANT_LINK = """
import os, sys
try:
    os.symlink(sys.argv[1], sys.argv[2])
    print("linked")
except OSError as error:
    print("denied", error.strerror)
"""


def test_another_user_cannot_swap_the_loaders_epoch_state(nobody_python, shared_tmp, marker):
    state_file = EpochStateFile()
    beside = os.path.join(os.path.dirname(state_file.path), "planted")
    # Where the old code wrote (`<state>.partial`), and a new file beside the state: nobody plants pickles.
    planted = _as_nobody(nobody_python, PLANT_PICKLE, str(marker), f"{state_file.path}.partial", beside)
    assert "wrote" not in planted, f"nobody created files in the state's folder:\n{planted}"
    wanted = EpochState(3, frozenset({"a", "b"}), ":r", 7)
    state_file.write(wanted)
    # After the write, nobody tries to replace the state itself with a pickle.
    rewritten = _as_nobody(nobody_python, PLANT_PICKLE, str(marker), state_file.path)
    assert read_epoch_state(state_file.path) == wanted
    assert not marker.exists(), "a worker unpickled the other user's file"
    assert "wrote" not in rewritten
    state_file.close()


def test_the_epoch_state_works_in_a_setgid_tmpdir_and_is_refused_once_others_may_enter(tmp_path, monkeypatch):
    # A pod's /tmp under fsGroup is setgid (the kubelet's doing): the state folder inherits the bit (02700).
    tmp_path.chmod(0o2777)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    state_file = EpochStateFile()
    assert os.stat(state_file.folder).st_mode & 0o7777 == 0o2700
    state_file.write(EpochState(1, frozenset(), "", None))
    assert read_epoch_state(state_file.path).epoch == 1
    os.chmod(state_file.folder, 0o2750)  # the group may now enter: refused, naming the folder
    with pytest.raises(ImagenetTrainError, match=f"{state_file.folder}: expected a private directory"):
        read_epoch_state(state_file.path)
    state_file.close()


def test_a_link_planted_at_the_epoch_state_is_not_followed(nobody_python, shared_tmp, marker):
    victim = shared_tmp / "victim"
    victim.write_text("precious\n")
    state_file = EpochStateFile()
    _as_nobody(nobody_python, PLANT_LINK, str(victim), f"{state_file.path}.partial")
    state_file.write(EpochState(0, frozenset(), "", None))
    assert victim.read_bytes() == b"precious\n"
    assert read_epoch_state(state_file.path).epoch == 0
    state_file.close()


# -- 3. the I/O-wait stamp ---------------------------------------------------------------------------
def _wait_out_one_refusal() -> None:
    """One refused connection waited out: the wait consults the node's log stamp."""
    failures = [ConnectionRefusedError(111, "Connection refused")]

    def attempt():
        if failures:
            raise failures.pop()
        return "ok"

    assert resumable.call("http://127.0.0.1:9/shard.tar", 60, attempt) == "ok"


def test_a_link_planted_at_the_io_wait_stamp_is_not_followed(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = tmp_path / f"imagenet-train-{os.geteuid()}"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.utime(victim, (0, 0))  # long unchanged: a stamp this old lets the next wait log and write it
    (folder / resumable.wait_stamp_name()).symlink_to(victim)
    _wait_out_one_refusal()
    assert victim.read_text() == "precious\n"
    assert "waiting for http://127.0.0.1:9/shard.tar" in caplog.text  # the wait is still logged


def test_an_io_wait_folder_made_by_another_user_is_not_used(nobody_python, shared_tmp, caplog):
    victim = shared_tmp / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o666)
    os.utime(victim, (0, 0))
    folder = shared_tmp / f"imagenet-train-{os.geteuid()}"
    code = "import os, sys; os.umask(0); os.mkdir(sys.argv[1]); os.symlink(sys.argv[2], os.path.join(*sys.argv[1::2]))"
    _as_nobody(nobody_python, code, str(folder), str(victim), resumable.wait_stamp_name())  # folder, victim, name
    _wait_out_one_refusal()
    assert victim.read_text() == "precious\n"
    assert "waiting for" in caplog.text


def test_the_io_wait_line_is_still_throttled_per_node(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _wait_out_one_refusal()
    _wait_out_one_refusal()
    assert caplog.text.count("waiting for") == 1
    folder = tmp_path / f"imagenet-train-{os.geteuid()}"
    assert folder.stat().st_mode & 0o777 == 0o700


# -- 4. leftovers in $TMPDIR ---------------------------------------------------------------------------
def test_a_closed_epoch_loader_leaves_nothing_in_tmpdir(digit_shards, tmp_path, monkeypatch):
    # multiprocessing makes its own temp folder once per process, at its first use: made here, inside tmp_path,
    # it would outlive the test and its removal at exit would fail once pytest has removed tmp_path.
    multiprocessing.util.get_temp_dir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    source = resolve_source(str(digit_shards / "shards.json"))
    stream = ShardStream(source.val_urls, ValPreset(32, 32).build(), batch_size=32, shuffle_buffer=0)
    loader = EpochLoader(stream, workers=2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert sum(len(labels) for _, labels, _ in loader) > 0
    loader.close()
    assert sorted(p.name for p in tmp_path.glob("imagenet-train-*")) == []


def test_a_training_run_leaves_nothing_in_its_tmpdir(digit_shards, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = ["train", "--shards", str(digit_shards), "--run-dir", str(tmp_path / "run"), *TRAIN, "--eval-every", "1"]
    result = subprocess.run(
        [str(Path(sys.executable).with_name("imagenet-train")), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmp.glob("imagenet-train-*")) == []
