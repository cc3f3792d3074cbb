"""Which rank stopped answering, when a collective times out (--collective-timeout).

A timed-out collective says nothing useful about who it waited for: gloo's error is "Timed out waiting Nms for
recv operation to complete", with no peer, and in a ring every rank waits on its neighbour, not on the rank that
hung. So every rank publishes its host in the job's store at start-up and, from a thread, a beat counter every
`interval` seconds. A rank whose collective timed out reads every counter twice, some beats apart: a rank whose
counter did not move is stopped (SIGSTOP, a frozen node, a process stuck holding the GIL) and is named with its
host; a rank that still beats is alive and busy elsewhere (an outage past the timeout, a code path the others
did not take). The store, not a collective: the collectives are what broke. The beats cost one store write per
rank per interval, off the training thread.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from imagenet_train import waiting

BEATS_PER_TIMEOUT = 40  # beats within one --collective-timeout: the default's 1200 s beats every 30 s
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.5, 30.0
SILENT_BEATS = 2.5  # a rank whose counter stays put over this many intervals has stopped answering


def interval_s(timeout_s: float) -> float:
    """Seconds between beats for a collective timeout of `timeout_s`."""
    return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, timeout_s / BEATS_PER_TIMEOUT))


@dataclass(frozen=True)
class Beat:
    """What a rank last published: its beat count, host and process id."""

    count: int
    host: str
    pid: int

    def encode(self) -> str:
        """The store's value for this beat ('count pid host')."""
        return f"{self.count} {self.pid} {self.host}"

    @classmethod
    def decode(cls, value: bytes) -> Beat:
        """A beat from the store's value ('count pid host'); an unreadable one counts as never beating."""
        parts = value.decode(errors="replace").split(" ", 2)
        try:
            return cls(int(parts[0]), parts[2], int(parts[1]))
        except (ValueError, IndexError):
            return cls(-1, "?", 0)


def silent(before: dict[int, Beat], after: dict[int, Beat], me: int) -> list[int]:
    """The ranks (other than `me`) whose beat did not move between two readings."""
    return sorted(rank for rank, beat in before.items() if rank != me and after.get(rank, beat).count <= beat.count)


def hang_message(rank: int, timeout_s: float, before: dict[int, Beat], after: dict[int, Beat], exit_code: int) -> str:
    """The one line a rank whose collective timed out prints: which rank(s) stopped answering, on which host."""
    quiet = silent(before, after, rank)
    head = f"rank {rank}: no collective finished within --collective-timeout {timeout_s:g} s"
    if quiet:
        last = {r: after.get(r, before[r]) for r in quiet}
        named = ", ".join(f"rank {r} on host {beat.host} (pid {beat.pid})" for r, beat in last.items())
        what = f"{named} stopped answering (no heartbeat for {SILENT_BEATS:g} beats)"
    elif before:
        what = "every rank still answers (one is busy elsewhere: an outage past the timeout, or a path not taken)"
    else:
        what = "the job's store did not answer either (its host may be the one that stopped)"
    return f"{head}: {what}; exit {exit_code} asks the launcher to restart every node, to resume with --resume latest"


def _prefix() -> str:
    return f"imagenet-train/beat/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


class Heartbeat:
    """This rank's beat in the job's store, from a daemon thread (see the module docstring)."""

    def __init__(self, rank: int, world: int, timeout_s: float, store: dist.Store | None = None):
        self.rank, self.world, self.interval = rank, world, interval_s(timeout_s)
        self.store = store if store is not None else dist.distributed_c10d._get_default_store()
        self.host, self.pid, self.count = socket.gethostname(), os.getpid(), 0
        self._stop = threading.Event()

    def start(self) -> Heartbeat:
        """Publish the first beat (host and pid) now, then beat every interval until `stop`."""
        self._beat()
        threading.Thread(target=self._run, name="heartbeat", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop beating (the run is over)."""
        self._stop.set()

    def _beat(self) -> None:
        self.count += 1
        self.store.set(f"{_prefix()}/{self.rank}", Beat(self.count, self.host, self.pid).encode())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat()
            except Exception:  # the store gone (the job ending): nothing left to tell anyone
                return

    def read(self) -> dict[int, Beat]:
        """Every rank's last beat, by rank (ranks that have published none are left out)."""
        keys = [f"{_prefix()}/{rank}" for rank in range(self.world)]
        found = {}
        for rank, key in enumerate(keys):
            if self.store.check([key]):  # check, not get: a missing key's get blocks for the store's timeout
                found[rank] = Beat.decode(self.store.get(key))
        return found

    def who_stopped(self, exit_code: int, timeout_s: float, wait: Callable[[float], None] = time.sleep) -> str:
        """After a timed-out collective: read the beats twice, SILENT_BEATS intervals apart, and say who stopped.

        The readings run on a thread joined with a bound: a store hosted by the stopped rank would block them."""
        readings: list[dict[int, Beat]] = []

        def measure() -> None:
            readings.append(self.read())
            wait(SILENT_BEATS * self.interval)
            readings.append(self.read())

        reader = threading.Thread(target=measure, name="who-stopped", daemon=True)
        reader.start()
        with waiting.interruptible("naming the rank that stopped answering"):  # a stop signal need not wait for it
            reader.join(SILENT_BEATS * self.interval + 30)
        before, after = readings if len(readings) == 2 else ({}, {})
        return hang_message(self.rank, timeout_s, before, after, exit_code)
