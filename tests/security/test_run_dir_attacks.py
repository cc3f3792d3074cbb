"""A run directory and an upload-session folder prepared by another local user (`nobody`, through runuser): links
planted at the names a run writes (config.json, metrics.jsonl, a key log) must not lead a job run as root to
overwrite or append to a file of the attacker's choosing, a folder others may write to is refused in one line,
and what a run records (config, checkpoints, key logs, an upload session's capability) is private."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from integration.test_gcs import BUCKET, emulator  # noqa: F401 (a fixture: a real gcp-storage-emulator)

from imagenet_train.config import RunConfig
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.rundir.directory import RunDirectory
from imagenet_train.training.models import architecture
from security.test_state_attacks import _as_nobody, nobody_python  # noqa: F401 (a fixture: Python nobody may run)

from conftest import SMALL_TRAIN, cli

# One short epoch in split mode: every rank keeps a position key log, and the epoch's checkpoint and final.pt.
TRAIN = [*SMALL_TRAIN, "--mode", "split", "--epochs", "1", "--epoch-batches", "2", "--eval-every", "5"]
MARK = "the attacker's file, unchanged\n"
KEY_LOG = Path("position", "epoch-0000", "rank-0000-from-000000.keys")


@pytest.fixture
def shared_folder() -> Path:
    """A folder like /tmp (world-writable, sticky) that `nobody` can reach."""
    folder = Path(tempfile.mkdtemp(prefix="imagenet-train-test-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def targets(tmp_path) -> dict[str, Path]:
    """Files of root's that the attacker would like a run to overwrite or append to, each holding MARK."""
    found = {}
    for name in ("config.json", "metrics.jsonl", KEY_LOG.name):
        found[name] = tmp_path / f"target-{name}"
        found[name].write_text(MARK)
    return found


def _train(shards: Path, run_dir: Path, *more: str) -> subprocess.CompletedProcess:
    # 300 s: a run that is not refused (the code before the fix) trains its epoch; on a loaded machine that took
    # over 120 s.
    return cli("train", "--shards", str(shards), "--run-dir", str(run_dir), *TRAIN, *more, timeout=300)


def _one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("imagenet-train: error: ") and "Traceback" not in result.stderr, result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in last, last
    return last


def _unchanged(targets: dict[str, Path]) -> None:
    for name, path in targets.items():
        assert path.read_text() == MARK, f"the run wrote through the link planted at {name}"


# As nobody: a run folder anyone may write to, with links at config.json, metrics.jsonl and rank 0's key log.
PLANT_RUN_DIR = """
import os, sys
os.umask(0)
run, config, metrics, keys = sys.argv[1:]
os.makedirs(os.path.join(run, "position", "epoch-0000"), 0o777)
os.symlink(config, os.path.join(run, "config.json"))
os.symlink(metrics, os.path.join(run, "metrics.jsonl"))
os.symlink(keys, os.path.join(run, "position", "epoch-0000", "rank-0000-from-000000.keys"))
print("planted")
"""


def test_links_planted_in_a_run_folder_of_another_user_are_not_followed(
    nobody_python,  # noqa: F811
    shared_folder,
    targets,
    digit_shards,
):
    run_dir = shared_folder / "run"
    paths = [str(targets[name]) for name in ("config.json", "metrics.jsonl", KEY_LOG.name)]
    assert _as_nobody(nobody_python, PLANT_RUN_DIR, str(run_dir), *paths) == "planted\n"
    result = _train(digit_shards, run_dir)
    _unchanged(targets)
    _one_line_error(result, f"--run-dir {run_dir}: owned by uid ", "refused")


def test_a_run_folder_others_may_write_to_is_refused_in_one_line(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o777)
    result = _train(digit_shards, run_dir)
    line = _one_line_error(result, f"--run-dir {run_dir}: mode drwxrwxrwx", "refused")
    assert "owned by" not in line  # ours, but open to others' writes
    assert list(run_dir.iterdir()) == []  # nothing written before the refusal


@pytest.mark.parametrize("mode", [0o770, 0o1777, 0o707])
def test_the_run_folder_check_refuses_each_way_others_may_write(mode, tmp_path, monkeypatch):
    monkeypatch.delenv("IMAGENET_TRAIN_TRUST_GROUP", raising=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(mode)
    with pytest.raises(ImagenetTrainError, match=f"^--run-dir {run_dir}: mode {stat.filemode(stat.S_IFDIR | mode)};"):
        RunDirectory(RunConfig(run_dir=str(run_dir)), 1.0, 0, True, {}, {})


def test_a_group_writable_run_folder_is_accepted_only_for_our_own_group_when_trusted(tmp_path, monkeypatch):
    """The kubelet makes a volume group-writable for the pod's fsGroup at each mount: `launch` sets
    IMAGENET_TRAIN_TRUST_GROUP=1 in a pod, and then our own group's write bit is not a refusal."""
    from imagenet_train.io.owned import TRUST_GROUP, owned_folder  # (a new module: on abc5a5b this fails here)

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o2770)
    monkeypatch.setenv(TRUST_GROUP, "1")
    assert owned_folder(run_dir) == run_dir
    os.chown(run_dir, -1, 65534)  # a group this process is not in
    with pytest.raises(ImagenetTrainError, match="mode drwxrws---"):
        owned_folder(run_dir)


def test_a_run_folder_that_is_another_users_link_is_refused(nobody_python, shared_folder, tmp_path, digit_shards):  # noqa: F811
    own = tmp_path / "own-run"
    own.mkdir(mode=0o700)
    run_dir = shared_folder / "run"
    code = "import os, sys; os.symlink(sys.argv[1], sys.argv[2]); print('linked')"
    assert _as_nobody(nobody_python, code, str(own), str(run_dir)) == "linked\n"
    result = _train(digit_shards, run_dir)
    _one_line_error(result, f"--run-dir {run_dir}: owned by uid ", "refused")
    assert list(own.iterdir()) == []


def test_links_left_in_our_own_run_folder_are_replaced_or_refused(targets, digit_shards, tmp_path):
    """A folder of ours may still hold links from before it was closed (or copied in): config.json and
    metrics.jsonl are written to a new file renamed over the link; a key log is appended to, so a link there
    is one line naming it, exit 2."""
    run_dir = tmp_path / "run"
    (run_dir / KEY_LOG.parent).mkdir(parents=True, mode=0o700)
    run_dir.chmod(0o700)
    (run_dir / "config.json").symlink_to(targets["config.json"])
    (run_dir / "metrics.jsonl").symlink_to(targets["metrics.jsonl"])
    (run_dir / KEY_LOG).symlink_to(targets[KEY_LOG.name])
    result = _train(digit_shards, run_dir)
    _unchanged(targets)
    _one_line_error(result, f"{run_dir / KEY_LOG}: a symbolic link", "refused")
    config = os.lstat(run_dir / "config.json")
    assert stat.S_ISREG(config.st_mode) and stat.S_IMODE(config.st_mode) == 0o600  # the link was replaced


def _mode(path: Path) -> int:
    info = os.lstat(path)
    assert not stat.S_ISLNK(info.st_mode), path
    return stat.S_IMODE(info.st_mode)


def test_a_runs_records_are_0600_in_0700_folders(digit_shards, tmp_path):
    run_dir = tmp_path / "runs" / "one"
    result = _train(digit_shards, run_dir, "--log-keys")
    assert result.returncode == 0, result.stderr[-3000:]
    folders = [run_dir, *(p for p in run_dir.rglob("*") if p.is_dir())]
    assert {"checkpoints", "position", "epoch-0000", "keys"} <= {p.name for p in folders}
    assert {str(p.relative_to(tmp_path)): _mode(p) for p in folders} == {
        str(p.relative_to(tmp_path)): 0o700 for p in folders
    }
    records = [
        run_dir / "config.json",
        run_dir / "metrics.jsonl",
        run_dir / "final.pt",
        *(run_dir / "checkpoints").iterdir(),
        run_dir / KEY_LOG,
        *(run_dir / "keys").iterdir(),
    ]
    assert len(records) >= 6
    assert {p.name: _mode(p) for p in records} == {p.name: 0o600 for p in records}


# -- class 10: a resumable-upload session record, a capability to write the object ----------------------------
def _upload(source: Path, url: str, sessions: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "IMAGENET_TRAIN_UPLOAD_SESSIONS": str(sessions),
        "IMAGENET_TRAIN_GCS_CHUNK": str(256 * 1024),  # many small chunks: the record stays a while
    }
    command = [str(Path(sys.executable).with_name("imagenet-train")), "upload", str(source), url, "--workers", "1"]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _big_file(tmp_path: Path) -> Path:
    source = tmp_path / "run"
    source.mkdir()
    (source / "big.pt").write_bytes(os.urandom(40 * 1024 * 1024))  # over RESUMABLE_MIN: a resumable session
    return source


def test_an_upload_session_record_is_0600_in_a_0700_folder(emulator, tmp_path):  # noqa: F811
    sessions = tmp_path / "cache" / "sessions"
    upload = _upload(_big_file(tmp_path), f"gs://{BUCKET}/session-modes", sessions)
    try:
        deadline, records = time.monotonic() + 60, []
        while not records and time.monotonic() < deadline and upload.poll() is None:
            records = [p for p in sessions.glob("*.json")] if sessions.is_dir() else []
            time.sleep(0.01)
        assert records, f"no session record appeared: {upload.poll()} {upload.stderr.read() if upload.stderr else ''}"
        assert _mode(records[0]) == 0o600  # replaced by rename before each chunk: the name is always there
        assert _mode(sessions) == 0o700
    finally:
        upload.kill()
        upload.communicate()


def test_an_upload_session_folder_of_another_user_is_refused_in_one_line(
    emulator,  # noqa: F811
    nobody_python,  # noqa: F811
    shared_folder,
    tmp_path,
):
    sessions = shared_folder / "sessions"
    code = "import os, sys; os.umask(0); os.mkdir(sys.argv[1], 0o777); print('made')"
    assert _as_nobody(nobody_python, code, str(sessions)) == "made\n"
    upload = _upload(_big_file(tmp_path), f"gs://{BUCKET}/session-refused", sessions)
    stdout, stderr = upload.communicate(timeout=120)
    result = subprocess.CompletedProcess(upload.args, upload.returncode, stdout, stderr)
    _one_line_error(result, f"upload sessions folder {sessions}: owned by uid ", "refused")
    assert list(sessions.iterdir()) == []  # no session record left where nobody can read it


def test_evaluate_writes_no_eval_json_through_a_link_in_another_users_run_folder(
    nobody_python,  # noqa: F811
    shared_folder,
    targets,
    digit_shards,
    tmp_path,
):
    # eval.json goes beside the weights it scored: weights in a folder of another user's, with a link planted at
    # eval.json, are scored, but nothing is written there.
    run_dir, link = shared_folder / "run", shared_folder / "run" / "eval.json"
    code = "import os, sys; os.umask(0); os.mkdir(sys.argv[1], 0o777); os.symlink(sys.argv[2], sys.argv[3])"
    _as_nobody(nobody_python, code, str(run_dir), str(targets["config.json"]), str(link))
    weights = run_dir / "weights.pt"
    torch.save(architecture(RunConfig(arch="resnet18"), 10).state_dict(), weights)
    small = ["--arch", "resnet18", "--val-resize", "32", "--val-crop-size", "32", "--workers", "1"]  # fmt: skip
    result = cli("evaluate", str(weights), "--shards", str(digit_shards), *small, timeout=300)
    _unchanged(targets)
    _one_line_error(
        result, f"{run_dir} (eval.json's folder, beside the weights; --out FILE writes elsewhere): ", "refused"
    )
