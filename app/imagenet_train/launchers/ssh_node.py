"""`imagenet-train ssh-node`: what `imagenet-train ssh` runs on each host; training dies with the SSH session.

Without a terminal, sshd sends no SIGHUP when the session ends, so the session's end is read as the end of
standard input: then training is asked to stop (SIGTERM: a clean pre-emption) and, after the grace period,
killed. This process is a child subreaper, so processes whose parent died (ranks of a killed torchrun,
DataLoader workers) are still ours to find and kill: no training process outlives the session.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PREAMBLE_LIMIT = 1 << 20  # the variables `imagenet-train ssh` sends first: a few URLs, never megabytes
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: orphans are then not ours to clean up
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _stop_when_node_dies(node: int) -> None:
    """In the child, before exec: SIGTERM it when this process dies, even SIGKILLed (no cleanup can run then).

    The child (`launch`) then stops its ranks as on any SIGTERM. PR_SET_PDEATHSIG fires when the thread that
    started the child ends: that is this process's main thread, which lives as long as the process.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != node:  # it died before the request took effect
        os._exit(128 + signal.SIGTERM)


def descendants(root: int) -> list[int]:
    """Process ids below `root` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stream:
                # The command name may hold spaces and parentheses; the parent id follows the last ')'.
                parent = int(stream.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def clean_up(grace: float) -> None:
    """Stop every process left below this one: SIGTERM, then SIGKILL after `grace` seconds."""
    deadline = time.monotonic() + grace
    _signal_all(descendants(os.getpid()), signal.SIGTERM)
    while descendants(os.getpid()) and time.monotonic() < deadline:
        _reap()
        time.sleep(0.1)
    _signal_all(descendants(os.getpid()), signal.SIGKILL)
    time.sleep(0.1)
    _reap()


def environment_from_stdin() -> dict[str, str]:
    """The variables `imagenet-train ssh` sent on stdin (one JSON line), read byte by byte up to its newline.

    Credentials (a proxy URL's password) come this way so that no `ps` on the host shows them.
    """
    from imagenet_train.errors import ImagenetTrainError

    line = bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte or len(line) > PREAMBLE_LIMIT:
            raise ImagenetTrainError("ssh-node --environment-on-stdin: expected one JSON line of variables on stdin")
        line += byte
    try:
        variables = json.loads(line)
    except ValueError:
        variables = None
    if not isinstance(variables, dict) or not all(
        isinstance(v, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k, v in variables.items()
    ):
        raise ImagenetTrainError("ssh-node --environment-on-stdin: expected a JSON object of NAME: text on stdin")
    return variables


def run(program: list[str], grace: float, environment_on_stdin: bool = False) -> int:
    """Run `imagenet-train PROGRAM...` until it ends or standard input closes; return its exit code."""
    extra = environment_from_stdin() if environment_on_stdin else {}
    _become_subreaper()
    # preexec_fn is safe here: no thread runs yet (the one watching stdin starts below).
    child = subprocess.Popen(
        [sys.executable, "-m", "imagenet_train.cli", *program],
        stdin=subprocess.DEVNULL,
        env={**os.environ, **extra},
        preexec_fn=functools.partial(_stop_when_node_dies, os.getpid()),
    )
    session_over = threading.Event()

    def watch_stdin() -> None:
        try:
            while os.read(0, 65536):
                pass
        except OSError:
            pass
        session_over.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    for signum in FORWARDED:
        signal.signal(signum, lambda number, _frame: child.send_signal(number))
    kill_at = None
    while child.poll() is None:
        if session_over.is_set() and kill_at is None:
            child.send_signal(signal.SIGTERM)
            kill_at = time.monotonic() + grace
        if kill_at is not None and time.monotonic() > kill_at:
            _signal_all(descendants(os.getpid()), signal.SIGKILL)
        time.sleep(0.2)
    code = child.returncode if child.returncode >= 0 else 128 - child.returncode
    clean_up(min(grace, 10.0))  # whatever the launcher left behind (it died without stopping its ranks)
    return code
