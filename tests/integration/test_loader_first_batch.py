"""A cold epoch's first batch: the workers' forkserver starts with the loader (and with the train and evaluate
commands, before they reach for the index) and has the decoders imported, and it still dies with its rank."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from imagenet_train.config import Config
from imagenet_train.training import models

from conftest import child_pids

LOADER = (
    "import multiprocessing.forkserver, sys\n"
    "from imagenet_train.datasets.source import resolve_source\n"
    "from imagenet_train.loading.presets import TrainPreset\n"
    "from imagenet_train.loading.stream import EpochLoader, ShardStream\n"
    "source = resolve_source(sys.argv[1])\n"
    "stream = ShardStream(urls=source.train_urls, transform=TrainPreset(24).build(), batch_size=8)\n"
    "loader = EpochLoader(stream, workers=2)\n"
    "print(multiprocessing.forkserver._forkserver._forkserver_pid, flush=True)\n"
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_forkserver_starts_with_the_loader_and_holds_the_decoders_before_a_worker_is_forked(digit_shards):
    """Started when the loader is made (its imports overlap the model's build), with the transform's modules
    preloaded: a worker forked from it unpickles its stream without importing the decoders again."""
    script = LOADER + (
        "assert multiprocessing.forkserver._forkserver._forkserver_pid is not None\n"
        "images, labels, keys = next(iter(loader))\n"
        "maps = open(f'/proc/{multiprocessing.forkserver._forkserver._forkserver_pid}/maps').read()\n"
        "print(' '.join(name for name in ('simplejpeg', 'PIL') if f'/{name}' in maps), flush=True)\n"
        "print(images.shape[0], flush=True)\n"
        "loader.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(digit_shards)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    forkserver, preloaded, batch = done.stdout.splitlines()
    assert forkserver != "None"  # running before the first epoch was asked for
    assert preloaded.split() == ["simplejpeg", "PIL"]  # their native libraries (torchvision's are loaded lazily)
    assert int(batch) == 8


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_rank_killed_before_its_first_epoch_takes_its_early_forkserver_with_it(digit_shards):
    """The forkserver now starts with the loader, before any epoch: a rank killed outright then must not leave it."""
    script = LOADER + "import time\ntime.sleep(600)\n"
    process = subprocess.Popen([sys.executable, "-c", script, str(digit_shards)], stdout=subprocess.PIPE, text=True)
    forkserver = process.stdout.readline().strip()
    assert forkserver.isdigit(), f"no forkserver running after the loader was made: {forkserver!r}"
    time.sleep(1)  # let it get into its preloads
    process.kill()
    process.wait()
    deadline = time.monotonic() + 60  # it may finish an import before it sees its parent gone
    while _alive(int(forkserver)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(int(forkserver)), "the forkserver outlived its rank"


@contextlib.contextmanager
def _silent_index() -> Iterator[str]:
    """An index URL on 127.0.0.1 whose server accepts connections and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as listener:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/shards.json"


def _forkserver_of(pid: int) -> int | None:
    """The pid of multiprocessing's forkserver among the children of `pid`, if one runs."""
    for child in child_pids(pid):
        with contextlib.suppress(OSError):
            if b"multiprocessing.forkserver" in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_train_and_evaluate_start_the_forkserver_before_they_reach_for_the_index(command, tmp_path):
    """Its imports (seconds) then overlap the index's fetch, the weights' load and the model's build, not the first
    batch: here the index never comes, and the forkserver runs all the same."""
    weights = tmp_path / "weights.pt"
    cfg = Config()
    cfg.run.arch = "resnet18"
    torch.save(models.create(cfg.run, 10, False).state_dict(), weights)
    executable = Path(sys.executable).with_name("imagenet-train")
    with _silent_index() as url:
        common = ["--shards", url, "--workers", "2", "--arch", "resnet18"]
        args = {
            "train": ["train", *common, "--run-dir", str(tmp_path / "run")],
            "evaluate": ["evaluate", str(weights), *common],
        }
        process = subprocess.Popen(
            [str(executable), *args[command]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        try:
            forkserver, deadline = None, time.monotonic() + 120  # the command's own imports, on a loaded machine
            while forkserver is None and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
                forkserver = _forkserver_of(process.pid)
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            _, stderr = process.communicate()
    assert forkserver is not None, f"no forkserver while {command} waited for its index: {stderr[-2000:]!r}"
