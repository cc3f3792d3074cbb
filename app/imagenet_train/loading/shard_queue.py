"""The dynamic shard queue (`--mode queue`): DataLoader workers claim shard indices at run time.

The counter lives in the job's existing torch.distributed store (the TCPStore torchrun started at
MASTER_ADDR:MASTER_PORT), incremented atomically with `store.add`, so fast ranks simply claim more
shards and every shard is read exactly once per epoch. A lone process uses a shared counter instead.
"""

from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING

from imagenet_train.errors import ImagenetTrainError

if TYPE_CHECKING:
    from torch.distributed import TCPStore


class StoreQueue:
    """Shard claims through the job's TCPStore; connects lazily, once per DataLoader worker."""

    def __init__(self, host: str, port: int, prefix: str):
        self.host, self.port, self.prefix = host, port, prefix
        self._store: TCPStore | None = None

    def __getstate__(self) -> dict:
        return {"host": self.host, "port": self.port, "prefix": self.prefix, "_store": None}

    def claim(self, epoch: int) -> int:
        """The next unclaimed position in this epoch's shard order (may exceed the number of shards)."""
        if self._store is None:
            from torch.distributed import TCPStore  # noqa: F811 (imported for the checker above, at run time here)

            try:
                self._store = TCPStore(
                    self.host,
                    self.port,
                    is_master=False,
                    timeout=datetime.timedelta(seconds=60),
                    wait_for_workers=False,
                )
            except Exception as error:  # the store's own exceptions are RuntimeError/DistStoreError
                raise ImagenetTrainError(
                    f"queue: cannot reach the job store at {self.host}:{self.port} ({error})"
                ) from None
        return int(self._store.add(f"{self.prefix}/epoch{epoch}", 1)) - 1


class LocalQueue:
    """Shard claims shared by the DataLoader workers of a single process."""

    def __init__(self, context):
        self.counter = context.Value("q", 0)
        self.epoch = context.Value("q", -1)

    def claim(self, epoch: int) -> int:
        """The next unclaimed position in this epoch's shard order (may exceed the number of shards)."""
        with self.counter.get_lock():
            if self.epoch.value != epoch:
                self.epoch.value, self.counter.value = epoch, 0
            self.counter.value += 1
            return self.counter.value - 1


def job_queue(prefix: str, world: int, context):
    """The queue for this job: the torchrun store when there are several ranks, else a local counter."""
    if world > 1:
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not host or not port:
            raise ImagenetTrainError(
                "--mode queue with several ranks needs MASTER_ADDR/MASTER_PORT (run under torchrun)"
            )
        return StoreQueue(host, int(port), prefix)
    return LocalQueue(context)
