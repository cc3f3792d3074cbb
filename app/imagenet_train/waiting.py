"""One wait for the whole program: every pause (an outage's back-off, a retry, a probe, the results mirror's
flush, the wait for the next batch) ends at its deadline or at a stop signal, whichever comes first.

SIGTERM (Kubernetes eviction, spot reclaim) and SIGUSR1 (Slurm's `--signal`) are noted by one handler. Code
that can stop cleanly at a boundary (the training step) reads `requested()`; code that waits calls `sleep`,
which raises `Stopping` as soon as a stop is noted. A wait inside someone else's blocking call (the
DataLoader's queue, a socket read) runs under `interruptible()`: the handler raises `Stopping` right there.
A wait inside C++ (the rendezvous, the first collectives) runs under `blocking()`: it may never return to
Python for the handler to run at all, so a watchdog thread, woken through the signal wakeup fd, ends the
process with the pre-emption exit code when the handler has not run within `UNANSWERED_S`. (A long step in
C++ is not a wait: the signal is handled when it returns, and the ranks stop at the step's vote.)

`Stopping` is a BaseException, like KeyboardInterrupt, so that no retry or broken-shard policy that catches
Exception takes a stop for a failure and carries on. It is raised on the main thread only, which decides how
the process leaves: a helper thread's wait (the results upload, which the stop's own flush still needs) goes on
until the process exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

from imagenet_train.errors import ImagenetTrainError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
SLICE_S = 0.1  # how often a wait off the main thread looks at its deadline (the main thread is woken by a signal)
NOTED_GRACE_S = 2.0  # how long a wait entered after a stop was noted may last
UNANSWERED_S = 3.0  # a signal the main thread has not handled by then finds it stuck in C++: the process ends


class Stopping(BaseException):
    """A stop signal arrived while this process waited: leave now, with the pre-emption exit code."""

    def __init__(self, signum: int, where: str = ""):
        super().__init__(f"{signal.Signals(signum).name}{f' while {where}' if where else ''}")
        self.signum, self.where = signum, where
        self.reason = ""  # why the rank leaves without a checkpoint, once that is decided

    @property
    def exit_code(self) -> int:
        """128 + N, as for a process killed by signal N (143 for SIGTERM, 138 for SIGUSR1)."""
        return 128 + self.signum


class _State:
    signum = 0  # the first stop signal the handler saw (0: none)
    cut_short = False  # a wait was ended by a stop: the process should leave at once
    interruptible = 0  # > 0 while the main thread is inside `interruptible()`
    where = ""  # what the main thread is waiting for there, for the one-line message
    blocked = ""  # what the main thread waits for inside `blocking()` (empty: not there)
    installed = False


_state = _State()
_local = threading.local()  # .deadline: (monotonic time, what) of this thread's `deadline()` block, if any


def requested() -> int:
    """The stop signal this process received (0: none)."""
    return _state.signum


def cut_short(now: bool = False) -> bool:
    """Whether a stop signal has ended a wait of the main thread, so the process is on its way out (`now`: note
    that it is, for a stop that ended a collective instead)."""
    _state.cut_short = _state.cut_short or now
    return _state.cut_short


def leave_now(code: int) -> None:
    """After a stop that cut a wait short, once everything to keep is written: exit with `code` at once, without
    the interpreter's teardown (freeing torch takes seconds on a busy node, past a pod's grace)."""
    if not _state.cut_short:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def check(where: str = "") -> None:
    """On the main thread, raise Stopping if a stop signal has arrived; on any, the one-line error of a
    `deadline()` that has passed."""
    if _state.signum and _on_main_thread():
        _state.cut_short = True
        raise Stopping(_state.signum, where)
    limit = getattr(_local, "deadline", None)
    if limit is not None and time.monotonic() > limit[0]:
        raise ImagenetTrainError(limit[1])


@contextlib.contextmanager
def deadline(seconds: float, message: str) -> Iterator[None]:
    """Within this block (on this thread), every wait and every read ends with ImagenetTrainError(`message`)
    once `seconds` have passed."""
    saved = getattr(_local, "deadline", None)
    ends = time.monotonic() + seconds
    _local.deadline = saved if saved and saved[0] <= ends else (ends, message)
    try:
        yield
    finally:
        _local.deadline = saved


def left(default: float) -> float:
    """Seconds until this thread's deadline (`default` when there is none, 0 once it has passed)."""
    limit = getattr(_local, "deadline", None)
    return default if limit is None else max(0.0, min(default, limit[0] - time.monotonic()))


def sleep(seconds: float, where: str = "") -> None:
    """Sleep `seconds`, or (on the main thread) raise Stopping as soon as a stop signal arrives; a `deadline()`
    that passes meanwhile ends the sleep with its error."""
    ends = time.monotonic() + max(0.0, seconds)
    with interruptible(where):
        while True:
            check(where)
            remaining = min(ends, _ends()) - time.monotonic()
            if remaining <= 0:
                check(where)
                return
            # The main thread's sleep is cut short by the handler itself; others look for the deadline every SLICE_S.
            time.sleep(remaining if _on_main_thread() and _state.installed else min(remaining, SLICE_S))


@contextlib.contextmanager
def interruptible(where: str = "") -> Iterator[None]:
    """On the main thread, a stop signal inside this block raises Stopping where the thread is blocked.

    A stop noted before the block is left to its boundary (the step's vote), but the block may then last only
    NOTED_GRACE_S: a rank that noted the signal mid-step and then meets an outage still leaves.
    """
    if not _on_main_thread():
        yield
        return
    saved = _state.where
    _state.interruptible += 1
    _state.where = where or saved
    alarm = _arm_alarm() if _state.signum and _state.interruptible == 1 else None
    try:
        yield
    finally:
        if alarm is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, alarm)
        _state.interruptible -= 1
        _state.where = saved


@contextlib.contextmanager
def blocking(where: str) -> Iterator[None]:
    """A wait that may sit in C++ (the rendezvous, a collective): interruptible, and a stop signal that Python
    cannot handle here within UNANSWERED_S ends the process (the watchdog); a stop noted before it starts ends it
    at once (the watchdog only hears signals that come while it runs)."""
    check(where)
    with interruptible(where):
        saved, _state.blocked = _state.blocked, where if _on_main_thread() else _state.blocked
        try:
            yield
        finally:
            _state.blocked = saved


def _arm_alarm():
    """Raise Stopping in the block after NOTED_GRACE_S (SIGALRM); returns the handler to put back."""
    previous = signal.signal(signal.SIGALRM, _on_signal)
    signal.setitimer(signal.ITIMER_REAL, NOTED_GRACE_S)
    return previous


def install() -> None:
    """Note SIGTERM and SIGUSR1 from now on and start the watchdog (main thread only; once per process)."""
    if not _on_main_thread() or _state.installed:
        return  # a launcher's thread (Ray Train): signals are the launcher's to handle
    for number in STOP_SIGNALS:
        signal.signal(number, _on_signal)
    read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC) if hasattr(os, "pipe2") else os.pipe()
    os.set_blocking(read, True)
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read,), name="stop-watchdog", daemon=True).start()
    _state.installed = True


def _on_signal(signum: int, _frame) -> None:
    # Only plain assignments here: a lock taken in a handler can deadlock against the thread it interrupted.
    if signum != signal.SIGALRM:
        _state.signum = _state.signum or signum
    if _state.interruptible:
        _state.cut_short = True
        raise Stopping(_state.signum, _state.where)


def _watch(read: int) -> None:
    """Wait for stop signals at the C level; end the process if the main thread never gets to handle one."""
    while True:
        try:
            data = os.read(read, 64)
        except InterruptedError:
            continue
        if not data:
            return
        for number in data:
            where = _state.blocked
            if number in STOP_SIGNALS and where and not _answered(UNANSWERED_S) and _state.blocked:
                name = signal.Signals(number).name
                print(
                    f"imagenet-train: stopped by {name} while {where} (blocked outside Python): exiting without a "
                    f"checkpoint; continue with --resume latest",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(128 + number)


def _answered(within: float) -> bool:
    """Whether the Python handler has noted a stop within `within` seconds."""
    deadline = time.monotonic() + within
    while not _state.signum:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _ends() -> float:
    limit = getattr(_local, "deadline", None)
    return float("inf") if limit is None else limit[0]


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def reset() -> None:
    """Forget a noted stop signal (tests, and a process that runs several trainings in turn)."""
    _state.signum = 0
