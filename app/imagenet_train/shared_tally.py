"""Counters in shared memory: added to by the processes a tally was pickled to (a loader's workers), read by the
rank that made it. The damage and outage tallies are two of them."""

from __future__ import annotations

import multiprocessing.context


class SharedTally:
    """`size` counters of array type `typecode` ("q": integers, "d": floats), one lock for all of them."""

    def __init__(self, context: multiprocessing.context.BaseContext, typecode: str, size: int):
        self.values = context.Array(typecode, size)

    def increase(self, *amounts: tuple[int, float]) -> None:
        """Add each (counter, amount) pair, all under one lock."""
        with self.values.get_lock():
            for counter, amount in amounts:
                self.values[counter] += amount

    def read(self) -> tuple:
        """Every counter, as one consistent reading."""
        with self.values.get_lock():
            return tuple(self.values[:])
