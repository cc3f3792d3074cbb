"""How long the training loop waits for its next batch: the share of step time the input pipeline costs."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from imagenet_train import waiting

Item = TypeVar("Item")


class DataWait:
    """Times a loop's waits for the next item against the loop's whole time."""

    def __init__(self) -> None:
        self.waited = 0.0
        self.started: float | None = None
        self.ended: float | None = None

    def timed(self, items: Iterable[Item], where: str = "waiting for the next batch") -> Iterator[Item]:
        """Yield from `items`, adding the time spent inside each `next` to `waited`; a stop signal during a `next`
        raises waiting.Stopping there (the loader's workers may be asleep in an outage), saying `where`."""
        iterator = iter(items)
        self.started = time.perf_counter()
        try:
            while True:
                before = time.perf_counter()
                try:
                    with waiting.interruptible(where):
                        item = next(iterator)
                except StopIteration:
                    return
                finally:
                    self.waited += time.perf_counter() - before
                yield item
        finally:
            self.ended = time.perf_counter()

    @property
    def fraction(self) -> float:
        """Waiting time over loop time (0 before the loop ran)."""
        if self.started is None:
            return 0.0
        total = (self.ended or time.perf_counter()) - self.started
        return min(1.0, self.waited / total) if total > 0 else 0.0
