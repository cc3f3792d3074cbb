"""Riding out outages: one reader for every remote scheme that reopens at the byte where a read broke off,
and one policy for how long to keep trying (a time budget, capped exponential backoff with jitter).

A scheme supplies `open_at(position) -> Body`; the body's read errors that may pass (connection refused or
reset, timeouts, HTTP 5xx/429, a cloud API's "unavailable") are raised as `Transient`, or as OSError, and
are retried until `--io-timeout` seconds of outage have passed. Anything else (404, permission denied,
a server that ignores Range) is an ImagenetTrainError and fails at once.

A read has a deadline, not only an inactivity timeout: a connection that delivers less than MIN_RATE bytes a
second over a window (STALL_WINDOW_S, or half --io-timeout when shorter) counts as a failed attempt, whose outage
began when the window did, and the read resumes at its byte on a new connection. Every wait between attempts
is `waiting.sleep`, so a stop signal ends it at once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import io
import logging
import os
import random
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from imagenet_train import waiting
from imagenet_train.errors import ImagenetTrainError, visible
from imagenet_train.io import outage_tally

log = logging.getLogger(__name__)

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 30.0
LOG_EVERY_S = 60.0
# The slowest a connection may deliver and still count as working: 1 KiB/s averaged over 30 s. A server that
# sends its headers and then a byte every few seconds never trips a socket's inactivity timeout; this cuts it off.
MIN_RATE = 1024
STALL_WINDOW_S = 30.0


def stall_window(budget: float) -> float:
    """Seconds over which a connection must deliver MIN_RATE bytes a second: STALL_WINDOW_S, or half the outage
    budget when that is shorter, so a stall leaves time to resume on a new connection (at least 1 s; a budget of 0,
    no retries, keeps the full window)."""
    return max(1.0, min(STALL_WINDOW_S, budget / 2)) if budget > 0 else STALL_WINDOW_S


class Transient(Exception):
    """A failure that an outage explains: worth waiting out."""


RETRYABLE = (Transient, OSError, http.client.HTTPException)
# Local conditions, not outages: a file that went away (a pruned checkpoint) is not waited for.
LOCAL = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)
LOCAL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})  # a full or read-only disk


def is_local(error: BaseException) -> bool:
    """A failure of this machine's files (it names one, or is a full or read-only disk), which no wait mends."""
    return isinstance(error, LOCAL) or (
        isinstance(error, OSError) and (error.filename is not None or error.errno in LOCAL_ERRNOS)
    )


class Body(Protocol):
    def read(self, size: int) -> bytes:
        """Up to `size` bytes of the response; b"" at its end."""

    def close(self) -> None:
        """Let go of the connection."""


@dataclass
class Opened:
    """A response body positioned at the requested byte, and how many bytes it will deliver (if known)."""

    body: Body
    remaining: int | None = None
    size: int | None = None  # the whole object's size, where the scheme reports it


def backoff(attempt: int, rng: random.Random = random._inst) -> float:
    """Seconds before retry `attempt` (0-based): exponential from 0.5 s, capped at 30 s, jittered."""
    return min(MAX_DELAY_S, FIRST_DELAY_S * 2**attempt) * rng.uniform(0.5, 1.0)


class Outage:
    """One stretch of failures of one URL: sleeps between attempts and gives up after the budget."""

    def __init__(self, url: str, budget: float, since: float | None = None):
        self.url, self.budget = url, budget
        self.started = time.monotonic() if since is None else since  # a stall's outage began with its window
        self.attempt = 0
        self.counted = self.started  # the outage's seconds up to here are in the tally (/metrics)

    def wait(self, error: BaseException) -> None:
        """Sleep before the next attempt, or raise the one-line error once the budget is spent."""
        reason = describe(error)
        elapsed = time.monotonic() - self.started
        delay = backoff(self.attempt)
        if elapsed + delay > self.budget:
            self._count(retries=0)
            raise ImagenetTrainError(
                f"{self.url}: unreachable for {elapsed:.0f} s ({reason}); gave up at --io-timeout {self.budget:g} s"
            ) from None
        if _node_may_log():
            log.warning("waiting for %s: %s (%.0f s of --io-timeout %.0f s)", self.url, reason, elapsed, self.budget)
        self.attempt += 1
        waiting.sleep(delay, f"waiting for {self.url}")
        self._count(retries=1)

    def _count(self, retries: int) -> None:
        """Tally the retry about to be made and the outage's seconds since the last count."""
        now = time.monotonic()
        outage_tally.record(retries, now - self.counted)
        self.counted = now


def describe(error: BaseException) -> str:
    """A short reason for a failed attempt: 'Connection refused', 'HTTP 503 Service Unavailable' (a server's words
    with their control characters made visible)."""
    reason = getattr(error, "reason", None) or getattr(error, "strerror", None) or str(error) or type(error).__name__
    lines = str(getattr(reason, "strerror", None) or reason).splitlines()
    return visible((lines[0] if lines else type(reason).__name__)[:200])  # an exception's text may be empty


def _node_may_log() -> bool:
    """At most one waiting line per minute per job on a node, across all its ranks and DataLoader workers there.

    The stamp lives in a per-user folder under $TMPDIR that must be ours, a real directory and closed to
    others; the stamp is opened without following links. Where that cannot be had, every wait is logged:
    a log throttle is never worth a failed run or a write through someone else's link.
    """
    try:
        handle = _open_stamp()
    except OSError:
        return True
    with os.fdopen(handle, "a") as stream:
        fcntl.flock(stream, fcntl.LOCK_EX)
        now, last = time.time(), os.fstat(stream.fileno())
        if last.st_size and now - last.st_mtime < LOG_EVERY_S:
            return False
        stream.write(".")
        stream.flush()
        os.utime(stream.fileno(), (now, now))
        return True


def _open_stamp() -> int:
    """The node's I/O-wait stamp, opened for appending; OSError where the folder or file is not safely ours."""
    folder = os.path.join(tempfile.gettempdir(), f"imagenet-train-{os.geteuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise PermissionError(f"{folder}: not this user's directory")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(folder, 0o700)  # made by an older version with the umask's mode: ours, so close it
    # O_NONBLOCK: a planted FIFO fails at once instead of blocking the open.
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    handle = os.open(os.path.join(folder, wait_stamp_name()), flags, 0o600)
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(handle)
        raise PermissionError("io-wait.stamp: not this user's file")
    return handle


def wait_stamp_name() -> str:
    """The I/O-wait stamp of the job this process belongs to: torchrun's run id (a fresh one per --standalone
    launch), else Slurm's job and step, else one for the node. Keyed by job, the throttle never silences a job's
    first waiting line because another (the same user's, on the same node) logged within the minute."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    slurm = os.environ.get("SLURM_JOB_ID", "")
    job = run if run != "none" else f"slurm-{slurm}.{os.environ.get('SLURM_STEP_ID', '')}" if slurm else "node"
    return "io-wait-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in job)[:64] + ".stamp"


def call(url: str, budget: float, attempt: Callable[[], object]):
    """`attempt()` until it succeeds, waiting out retryable failures for up to `budget` seconds."""
    outage = None
    while True:
        try:
            return attempt()
        except RETRYABLE as error:
            if is_local(error):
                raise
            outage = outage or Outage(url, budget)
            outage.wait(error)


class Stalled(Transient):
    """A connection that delivers, but slower than MIN_RATE: a failed attempt like a refused one."""

    def __init__(self, message: str, since: float):
        super().__init__(message)
        self.since = since


class ResumableReader(io.RawIOBase):
    """A remote object read front to back; an outage or a stall mid-read is waited out and the read resumes in
    place."""

    def __init__(self, url: str, open_at: Callable[[int], Opened], budget: float):
        self.url, self.open_at, self.budget = url, open_at, budget
        self.window = stall_window(budget)
        # A stall's outage outlives the few bytes the slow connections deliver: it ends only after a whole window
        # at the minimum rate, where any other outage ends at the first read that succeeds.
        self.outage: Outage | None = None
        self.stalled = False
        self.position = 0
        self.opened: Opened | None = call(url, budget, lambda: open_at(0))
        self._pace_from(time.monotonic())
        self.size = self.opened.size

    def readable(self) -> bool:
        """True: the object can be read."""
        return True

    def readinto(self, buffer) -> int:
        """Fill `buffer` with the next bytes, waiting out an outage; how many came (0 at the end)."""
        while True:
            try:
                if self.opened is None:
                    if self.size is not None and self.position >= self.size:
                        return 0  # broken off after the last byte: a Range from the end is a 416, not the end
                    self.opened = self.open_at(self.position)
                    self._pace_from(time.monotonic())
                data = self._read(self.opened, len(buffer))
                break
            except RETRYABLE as error:
                self._drop()
                self.outage = self.outage or Outage(self.url, self.budget, getattr(error, "since", None))
                self.stalled = isinstance(error, Stalled)
                self.outage.wait(error)
        if not self.stalled:
            self.outage = None
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)

    def _pace_from(self, now: float) -> None:
        self.window_start, self.window_bytes = now, 0

    def _read(self, opened: Opened, size: int) -> bytes:
        body = opened.body
        # read1: one receive, so a trickle returns after each byte and its rate is checked; read() would
        # block until `size` bytes came, however slowly.
        waiting.check()  # a stop, or the deadline of a whole operation (probe --wait)
        read1 = getattr(body, "read1", None)
        data = read1(size) if read1 is not None else body.read(size)
        if data:  # an empty read is the body's end (or a close, below), never a trickle, however long the pause
            self._pace(len(data))
        remaining = opened.remaining
        if not data and size and remaining:
            # http.client and friends report a connection closed before the promised length as a clean EOF.
            raise ConnectionError(f"connection closed with {remaining} bytes unread")
        if remaining is not None:
            opened.remaining = remaining - len(data)
        return data

    def _pace(self, count: int) -> None:
        """Fail the attempt when the connection delivered less than MIN_RATE bytes a second over a window."""
        now = time.monotonic()
        self.window_bytes += count
        elapsed = now - self.window_start
        spent = self.stalled and self.outage is not None and now - self.outage.started >= self.budget
        if elapsed < self.window and not spent:  # a stall already spent the budget: no second window
            return
        if self.window_bytes < MIN_RATE * elapsed:
            raise Stalled(f"{self.window_bytes} bytes in {elapsed:.0f} s, under {MIN_RATE} bytes/s", self.window_start)
        self.stalled = False
        self._pace_from(now)

    def _drop(self) -> None:
        """Let go of a broken connection; the next attempt reopens at the current position."""
        if self.opened is not None:
            with contextlib.suppress(Exception):  # a broken connection may not close cleanly
                self.opened.body.close()
        self.opened = None

    def close(self) -> None:
        """Close the stream and its connection."""
        if not self.closed:
            self._drop()
        super().close()


def buffered(reader: ResumableReader) -> io.BufferedReader:
    """The reader with a 1 MiB buffer, as the tar reader wants it; `.raw.size` stays reachable."""
    return io.BufferedReader(reader, buffer_size=1 << 20)
