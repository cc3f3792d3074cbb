"""A rank watches its launcher: when the parent process dies (SIGKILL included), the rank gets SIGTERM at once
and is killed, with its process group, after the launcher's grace period."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imagenet_train.launchers.launcher_death import launcher_grace

# A launcher in miniature: it starts one "rank" in a session of its own, as torchrun does, prints its pid, waits.
LAUNCHER = """
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True)
print(rank.pid, flush=True)
time.sleep(120)
"""
# The rank notes SIGTERM in a file and carries on, as a rank blocked where no signal helps would; a child of its
# own (a loader worker) sleeps in its process group.
RANK = """
import os, signal, subprocess, sys, time
{prelude}
from pathlib import Path
from imagenet_train.launchers.launcher_death import die_with_launcher
signal.signal(signal.SIGTERM, lambda *_: Path({marker!r}).write_text(str(time.monotonic())))
die_with_launcher()
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
Path({ready!r}).write_text(str(worker.pid))
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the watch is Linux-only")
# Without pidfds (Linux < 5.3, or a seccomp profile that refuses pidfd_open) the watch polls the parent's id.
@pytest.mark.parametrize("prelude", ["", "del os.pidfd_open"], ids=["pidfd", "polling"])
def test_a_rank_whose_launcher_is_sigkilled_gets_sigterm_then_dies_with_its_workers_after_the_grace(tmp_path, prelude):
    marker, ready = tmp_path / "sigterm", tmp_path / "ready"
    env = {**os.environ, "TORCHELASTIC_RUN_ID": "test", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "2"}
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, RANK.format(prelude=prelude, marker=str(marker), ready=str(ready))],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    rank = int(launcher.stdout.readline())
    deadline = time.monotonic() + 30
    while not ready.exists() or not ready.read_text():
        assert time.monotonic() < deadline and _alive(rank), "the rank did not start"
        time.sleep(0.05)
    worker = int(ready.read_text())
    launcher.kill()
    launcher.wait()
    killed = time.monotonic()
    while (_alive(rank) or _alive(worker)) and time.monotonic() - killed < 15:
        time.sleep(0.05)
    gone = time.monotonic() - killed
    for pid in (rank, worker):
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert marker.exists() and float(marker.read_text()) - killed < 1, "no SIGTERM as soon as the launcher died"
    assert not _alive(rank) and not _alive(worker), f"still running {gone:.0f} s after the launcher died"
    assert 2 <= gone < 5, f"gone after {gone:.1f} s, not after the 2 s grace"


@pytest.mark.parametrize(
    ("env", "grace"),
    [
        ({}, 30.0),  # torchrun's own default for --shutdown-timeout
        ({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "80"}, 80.0),  # what `launch --grace-period 80` sets
        ({"PET_SHUTDOWN_TIMEOUT": "5", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "80"}, 5.0),  # torchrun's flag wins
        ({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "soon"}, 30.0),  # not a number: torchrun's default
    ],
)
def test_a_rank_takes_its_launchers_grace_period(env, grace):
    assert launcher_grace(env) == grace
