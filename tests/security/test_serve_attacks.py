"""The shard server is least-privilege: started as root its nginx workers are not root, it serves the shard
folder only (a symlink whose owner is not its target's is refused), and `shards` does not pack files that
an ImageFolder tree's symlinks lead to outside it."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagenet_train.ops.serve import NginxServer

from conftest import child_pids, cli, jpeg_bytes, write_image_folder

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="starts nginx as root and hands files to another uid")


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A folder every user may enter (pytest's tmp_path is private to its owner), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="imagenet-train-serve-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def answer(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""


def worker_uids(master: int) -> list[int]:
    status = [Path(f"/proc/{pid}/status").read_text() for pid in child_pids(master)]
    return [int(next(line for line in s.splitlines() if line.startswith("Uid:")).split()[1]) for s in status]


@as_root
def test_nginx_started_as_root_runs_no_worker_as_root(public_dir):
    shards = public_dir / "shards"
    shards.mkdir()
    (shards / "a.tar").write_bytes(b"shard")
    assert shards.stat().st_uid == 0
    with NginxServer(str(shards)) as server:
        uids = worker_uids(server.pid)
        assert answer(f"{server.url}/a.tar") == (200, b"shard")
    assert len(uids) == 2 and 0 not in uids
    assert set(uids) == {pwd.getpwnam("nobody").pw_uid}


@as_root
def test_nginx_started_as_root_refuses_a_folder_its_workers_cannot_read(tmp_path):
    private = tmp_path / "shards"
    private.mkdir(mode=0o700)  # root's own: nobody may not read it
    command = [str(Path(sys.executable).with_name("imagenet-train")), "serve", str(private), "--port", "0"]
    serve = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = serve.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(serve.pid, signal.SIGTERM)  # it served instead: stop it and its nginx
        serve.communicate()
        pytest.fail(f"serve started on {private} as root")
    assert serve.returncode == 2 and stderr.count("\n") == 1, stderr
    assert f"{private}: nginx started as root serves as 'nobody', who cannot read this folder" in stderr
    assert "chmod o+rx" in stderr


@as_root
@pytest.mark.parametrize("target", ["/etc/passwd", "/etc/shadow"])
def test_a_symlink_out_of_the_shard_folder_by_another_user_is_not_served(public_dir, target):
    shards = public_dir / "shards"
    shards.mkdir()
    (shards / "a.tar").write_bytes(b"shard")
    link = shards / "leak.tar"
    link.symlink_to(target)
    nobody = pwd.getpwnam("nobody")
    os.lchown(link, nobody.pw_uid, nobody.pw_gid)  # made by whoever may write to the volume, not root
    with NginxServer(str(shards)) as server:
        status, body = answer(f"{server.url}/leak.tar")
        assert answer(f"{server.url}/a.tar") == (200, b"shard")
    assert status in (403, 404) and body == b""


@as_root
def test_a_symlink_to_a_file_of_another_owner_outside_the_folder_is_not_served(public_dir):
    secret = public_dir / "secret.key"  # outside the shard folder, owned by another uid, readable by all
    secret.write_bytes(b"someone else's key")
    secret.chmod(0o644)
    nobody = pwd.getpwnam("nobody")
    os.chown(secret, nobody.pw_uid, nobody.pw_gid)
    shards = public_dir / "shards"
    shards.mkdir()
    (shards / "leak.tar").symlink_to(secret)
    (shards / "inside").mkdir()
    (shards / "inside" / "real.tar").write_bytes(b"shard")
    (shards / "alias.tar").symlink_to(shards / "inside" / "real.tar")  # same owner: still served
    with NginxServer(str(shards)) as server:
        assert answer(f"{server.url}/leak.tar") in ((403, b""), (404, b""))
        assert answer(f"{server.url}/alias.tar") == (200, b"shard")


def test_shards_skip_and_list_image_folder_symlinks_leading_out(tmp_path):
    source = tmp_path / "in"
    write_image_folder(source, {"n01": 3, "n02": 3})
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "private.JPEG").write_bytes(jpeg_bytes(99))
    (source / "train" / "n01" / "leak.JPEG").symlink_to(outside / "private.JPEG")
    (source / "train" / "n02" / "alias.JPEG").symlink_to(source / "train" / "n01" / "n01_0.JPEG")  # inside
    plain = cli("shards", str(source), str(tmp_path / "out"), "--quiet")
    assert plain.returncode == 0, plain.stderr
    assert "symlinks leading out of" in plain.stdout and f"{source}/train/n01/leak.JPEG" in plain.stdout
    assert "1 symlinks lead out of" in plain.stderr  # the warning line
    index = json.loads((tmp_path / "out" / "shards.json").read_text())
    assert index["splits"]["train"]["nsamples"] == 7  # 6 images and the link inside the tree, not the leak
    followed = cli("shards", str(source), str(tmp_path / "followed"), "--quiet", "--follow-symlinks")
    assert followed.returncode == 0, followed.stderr
    index = json.loads((tmp_path / "followed" / "shards.json").read_text())
    assert index["splits"]["train"]["nsamples"] == 8
    assert "symlinks leading out of" not in followed.stdout


def test_a_symlinked_class_folder_leading_out_is_skipped_too(tmp_path):
    source = tmp_path / "in"
    write_image_folder(source, {"n01": 2})
    write_image_folder(tmp_path / "other", {"n09": 2})
    (source / "train" / "n09").symlink_to(tmp_path / "other" / "train" / "n09")
    result = cli("shards", str(source), str(tmp_path / "out"), "--quiet")
    assert result.returncode == 0, result.stderr
    index = json.loads((tmp_path / "out" / "shards.json").read_text())
    assert index["classes"] == ["n01"] and f"{source}/train/n09" in result.stdout
