"""A loader's count of I/O retries and seconds spent in outages, in shared memory: the DataLoader workers that ride
out the outages (io/resumable.py's Outage) add to it, and the rank that serves /metrics reads it.

A process counts into the tally `count_into` last gave it (a loader's worker: its loader's); a process that was
given none counts nothing.
"""

from __future__ import annotations

import multiprocessing.context

from imagenet_train.shared_tally import SharedTally


class OutageTally(SharedTally):
    """Retries and outage seconds, shared by the processes that were handed it (pickled to a loader's workers)."""

    RETRIES, SECONDS = range(2)

    def __init__(self, context: multiprocessing.context.BaseContext):
        super().__init__(context, "d", 2)

    def add(self, retries: int, seconds: float) -> None:
        """Count `retries` more attempts after a failure and `seconds` more of outage."""
        self.increase((self.RETRIES, retries), (self.SECONDS, seconds))

    def snapshot(self) -> tuple[int, float]:
        """(retries, outage seconds) so far."""
        retries, seconds = self.read()
        return int(retries), seconds


_counting: list[OutageTally | None] = [None]  # this process's tally


def count_into(tally: OutageTally | None) -> None:
    """Count this process's retries and outage seconds into `tally` from now on (None: count nothing)."""
    _counting[0] = tally


def record(retries: int, seconds: float) -> None:
    """Retries and seconds of outage met by this process, added to its tally if it has one."""
    tally = _counting[0]
    if tally is not None:
        tally.add(retries, seconds)
