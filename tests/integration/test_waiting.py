"""A stop signal ends every wait: a back-off sleep on the main thread or another, a blocking call under
`interruptible`, and (through the watchdog) a call stuck in C++ that never returns to Python. Each case is a
real process sent a real signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPTS = {
    "main-thread sleep": """
        waiting.sleep(60)
    """,
    "sleep on another thread": """
        # A helper thread (the results upload) is not cut short: the main thread decides, and leaves.
        import threading
        threading.Thread(target=waiting.sleep, args=(60,), daemon=True).start()
        waiting.sleep(60)
    """,
    "blocking read under interruptible": """
        import os
        read, write = os.pipe()
        with waiting.interruptible("reading a pipe nobody writes"):
            os.read(read, 1)
    """,
}

PROLOGUE = """
import sys
from imagenet_train import waiting
waiting.install()
print("ready", flush=True)
try:
{body}
except waiting.Stopping as stop:
    print(f"stopped: {{stop}}", flush=True)
    sys.exit(stop.exit_code)
print("not stopped", flush=True)
"""


def start(body: str) -> subprocess.Popen:
    """A python process running `body` after installing the stop handler; returns once it said it is ready."""
    script = PROLOGUE.format(body=textwrap.indent(textwrap.dedent(body).strip(), "    "))
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "ready", process.stderr.read()
    time.sleep(0.3)  # into the wait
    return process


def stop_time(process: subprocess.Popen, signum: int) -> float:
    """Seconds from sending `signum` to the process's exit."""
    sent = time.monotonic()
    process.send_signal(signum)
    process.wait(timeout=20)
    return time.monotonic() - sent


CASES = [(case, signal.SIGTERM) for case in sorted(SCRIPTS)] + [("main-thread sleep", signal.SIGUSR1)]


@pytest.mark.parametrize(("case", "signum"), CASES, ids=[f"{c}-{signal.Signals(n).name}" for c, n in CASES])
def test_a_stop_signal_ends_the_wait_at_once_with_the_preemption_code(case, signum):
    process = start(SCRIPTS[case])
    seconds = stop_time(process, signum)
    out = process.stdout.read()
    assert process.returncode == 128 + signum, (out, process.stderr.read())
    assert f"stopped: {signal.Signals(signum).name}" in out
    assert seconds < 1.5, f"{case}: {seconds:.1f} s to stop"


def test_a_signal_never_handled_because_the_rank_is_stuck_in_cpp_still_ends_it():
    # The rendezvous case: a store wait blocks in C++ and the Python handler cannot run until it returns.
    process = start(
        """
        import datetime
        from torch.distributed import TCPStore
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        print("in C++", flush=True)
        with waiting.blocking("waiting for a key nobody sets"):
            store.wait(["never-set"], datetime.timedelta(seconds=60))
        """
    )
    assert process.stdout.readline().strip() == "in C++"
    time.sleep(0.5)
    seconds = stop_time(process, signal.SIGTERM)
    errors = process.stderr.read()
    assert process.returncode == 143, errors
    assert "stopped by SIGTERM while waiting for a key nobody sets (blocked outside Python)" in errors
    assert seconds < 5, f"{seconds:.1f} s to stop"
