"""`plan --simulate`: run the real shard assignment and tar reading for every virtual rank and worker.

No torch.distributed and no DataLoader processes: each (rank, worker) stream is the loader's own
code (`ShardStream.shard_urls`, `read_shards`, `batched`) driven in this process, without decoding,
so the planner's arithmetic can be checked against what really comes out of the shards.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from imagenet_train.choices import BrokenShardPolicy, Mode
from imagenet_train.datasets.source import ShardInfo
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.loading.batching import batched
from imagenet_train.loading.stages import ShardReading, read_shards
from imagenet_train.loading.stream import ShardClaims, ShardStream
from imagenet_train.planning import plan

# The simulation reports damage rather than hiding it; shards the index has a sha256 for are checked against it.
READING = ShardReading(io_timeout=0, on_broken=BrokenShardPolicy.FAIL)


@dataclass
class SimulatedRank:
    rank: int
    batches: int = 0
    samples: int = 0
    opened: list[list[str]] = field(default_factory=list)  # per worker, shard URLs in the order opened


class _Counter:
    """The queue's counter for streams that all live in this process."""

    def __init__(self):
        self.next = 0

    def claim(self, epoch: int) -> int:
        self.next += 1
        return self.next - 1


def _no_transform(sample: object) -> object:
    """The simulation counts samples and never decodes one: the stream's transform is never called."""
    raise AssertionError("plan --simulate decodes no image")


def _stream(
    urls: list[str], setup: plan.Setup, rank: int, queue: ShardClaims | None = None, reading: ShardReading = READING
) -> ShardStream:
    return ShardStream(
        urls=urls,
        transform=_no_transform,
        batch_size=setup.batch_size,
        rank=rank,
        world=setup.world,
        resampled=setup.mode is Mode.RESAMPLED,
        seed=setup.seed,
        epoch=setup.epoch,
        reading=reading,
        queue=queue,
        repeat=setup.repeat,
    )


def _simulate_queue(urls: list[str], setup: plan.Setup, reading: ShardReading) -> list[SimulatedRank]:
    """All ranks' workers claim shards from one counter, taking turns sample by sample."""
    counter, workers = _Counter(), max(setup.workers, 1)
    results = [SimulatedRank(rank, opened=[[] for _ in range(workers)]) for rank in range(setup.world)]
    streams, counts = {}, {}
    for rank in range(setup.world):
        stream = _stream(urls, setup, rank, counter, reading)
        for worker in range(workers):
            shard_urls = _recording(stream.shard_urls(worker, workers), results[rank].opened[worker])
            streams[rank, worker] = read_shards(shard_urls, reading)
            counts[rank, worker] = 0
    while streams:
        for slot in list(streams):
            if next(streams[slot], None) is None:
                del streams[slot]
            else:
                counts[slot] += 1
    for (rank, _), samples in counts.items():
        results[rank].samples += samples
        results[rank].batches += sum(plan.batches_for(samples, setup.batch_size))
    return results


def _recording(urls, opened: list[str]):
    for url in urls:
        opened.append(url)
        yield url


class _ShardTally:
    """Counts the samples of the shard a resampled stream is reading. That stream's epoch is as long as the
    index says, so a shard that holds fewer samples than claimed ends the simulation: without this an index
    claiming billions of samples in a 20 KB shard would keep it re-reading that shard for days."""

    def __init__(self, claimed: dict[str, int]):
        self.claimed, self.url, self.count = claimed, "", 0

    def urls(self, urls: Iterator[str]) -> Iterator[str]:
        for url in urls:  # read_shards asks for the next URL only once the previous shard is read to its end
            self.check()
            self.url, self.count = url, 0
            yield url

    def samples(self, samples: Iterator[dict]) -> Iterator[dict]:
        for sample in samples:
            self.count += 1
            yield sample

    def check(self) -> None:
        claimed = self.claimed.get(self.url, 0)
        if self.url and self.count < claimed:
            raise ImagenetTrainError(f"{self.url}: holds {self.count} samples, the index says {claimed}")


def simulate(
    urls: list[str], setup: plan.Setup, expected: Mapping[str, ShardInfo] | None = None
) -> list[SimulatedRank]:
    """Batches and samples each virtual rank really gets in one epoch of `setup`; shards with a sha256 in
    `expected` (what the index says) are checked against it as they are read."""
    reading = dataclasses.replace(READING, expected=dict(expected or {}))
    if setup.mode is Mode.QUEUE:
        return _simulate_queue(urls, setup, reading)
    results = []
    for rank in range(setup.world):
        stream = _stream(urls, setup, rank, reading=reading)
        result = SimulatedRank(rank)
        if setup.mode is Mode.SPLIT:
            workers = plan.loader_workers(stream.rank_shards(), setup.workers)
            for worker in range(max(workers, 1)):
                opened: list[str] = []
                shard_urls = _recording(stream.shard_urls(worker, max(workers, 1)), opened)
                keys = (sample["__key__"] for sample in read_shards(shard_urls, reading))
                for batch in batched(keys, setup.batch_size, partial=True, collate_fn=list):
                    result.batches += 1
                    result.samples += len(batch)
                result.opened.append(opened)
            if setup.epoch_batches and result.batches > setup.epoch_batches:  # the loader's cut, batch-exact
                result.batches = setup.epoch_batches
        else:
            nominal = plan.assess(setup).ranks[rank].batches
            workers = max(setup.workers, 1)
            opened_lists: list[list[str]] = [[] for _ in range(workers)]
            tallies = [_ShardTally(dict(zip(urls, setup.shard_sizes, strict=True))) for _ in range(workers)]
            streams = [
                tally.samples(
                    read_shards(
                        tally.urls(_recording(stream.shard_urls(w, workers), opened_lists[w])),
                        reading,
                        None,
                        2 * len(urls) + 8,
                    )
                )
                for w, tally in enumerate(tallies)
            ]
            # Resampled worker streams never end; zip interleaves them as the DataLoader's round-robin does.
            interleaved = (s for group in zip(*streams, strict=False) for s in group)
            keys = (sample["__key__"] for sample in interleaved)
            for batch in itertools.islice(batched(keys, setup.batch_size, partial=False, collate_fn=list), nominal):
                result.batches += 1
                result.samples += len(batch)
            result.opened = opened_lists
        results.append(result)
    return results
