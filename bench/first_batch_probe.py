"""Timestamps from inside a loader's worker, for bench/first_batch.py: a ShardStream whose __iter__ notes when
the worker got there, when its first sample was read, when the shuffle buffer gave its first sample and when
its first batch was made. Imported by the workers when they unpickle the stream (bench/ on PYTHONPATH)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

IMPORTED = time.time()  # in a worker: when unpickling the stream began (this module comes first)

try:
    from imagenet_train.loading.stream import ShardStream
except ImportError:  # the package before the loader split
    from imagenet_train.loading.pipeline import ShardStream  # type: ignore[no-redef]


def process_start(pid: int) -> float:
    """When process `pid` started (epoch seconds, 10 ms resolution), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    # Seconds since boot, against this clock (btime in /proc/stat is rounded to the second).
    return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + ticks / os.sysconf("SC_CLK_TCK")


def first(items: Iterator, marks: dict, name: str) -> Iterator:
    """`items`, noting in `marks[name]` when the first one came."""
    for item in items:
        marks.setdefault(name, time.time())
        yield item


class ProbedStream(ShardStream):
    """A ShardStream that writes its worker's timestamps to `probe_dir` (one JSON file per worker)."""

    probe_dir: str = ""

    def __iter__(self) -> Iterator:
        from imagenet_train.loading import stages

        marks = {"worker_start": process_start(os.getpid()), "unpickle_start": IMPORTED, "iter": time.time()}
        marks["forkserver_start"] = process_start(os.getppid())
        read_shards, shuffled = stages.read_shards, stages.shuffled
        module = __import__(type(self).__mro__[1].__module__, fromlist=["read_shards"])
        saved = module.read_shards, module.shuffled
        module.read_shards = lambda *a, **k: first(read_shards(*a, **k), marks, "first_sample")
        module.shuffled = lambda *a, **k: first(shuffled(*a, **k), marks, "buffer_full")
        try:
            batches = super().__iter__()
        finally:
            module.read_shards, module.shuffled = saved
        for batch in batches:
            marks.setdefault("first_batch", time.time())
            with open(os.path.join(self.probe_dir, f"{os.getpid()}.json"), "w") as out:
                json.dump(marks, out)
            yield batch
