"""One rank's epoch stream: which shards each DataLoader worker reads (resampled, split or queue), and the
loader that hands the training loop one epoch of batches at a time from persistent workers."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import outage_tally, storage
from imagenet_train.limits import MAX_CORRUPT_STREAK
from imagenet_train.loading.batching import Batch, batched, collate, index_bound
from imagenet_train.loading.epochstate import EpochState, EpochStateFile, read_epoch_state
from imagenet_train.loading.sized import at_size
from imagenet_train.loading.stages import (
    DamageCounters,
    ShardReading,
    decoded,
    interleaved,
    read_shards,
    shuffled,
)
from imagenet_train.loading.workers import (
    main_script_hidden,
    start_worker_server,
    stop_workers,
    track_workers,
    worker_context,
    worker_init,
)
from imagenet_train.planning import plan
from imagenet_train.planning.queue_claims import queue_first_shard


def _worker() -> tuple[int, int]:
    info = get_worker_info()
    return (info.id, info.num_workers) if info else (0, 1)


class ShardClaims(Protocol):
    """A shard queue (loading/shard_queue.py): the next unclaimed position of an epoch's shard order."""

    def claim(self, epoch: int) -> int:
        """The next unclaimed position in `epoch`'s shard order (may exceed the number of shards)."""
        ...


@dataclass
class ShardStream(IterableDataset):
    """One rank's stream of batches, built in each DataLoader worker.

    `resampled`: each worker draws shards at random with replacement, forever (the loader sets the
    epoch length). With a `queue`, each worker reads one shard of its own (its first in split mode), then
    claims the next unread shard of the epoch's order at run time.
    Otherwise shards are permuted per epoch identically on all ranks, then split over ranks and
    workers. Both of the latter read every sample exactly once per epoch.
    """

    urls: Sequence[str]
    transform: Callable
    batch_size: int
    rank: int = 0
    world: int = 1
    resampled: bool = False
    shuffle_shards: bool = True
    shuffle_buffer: int = 1000
    seed: int = 0
    reading: ShardReading = ShardReading()
    epoch: int = 0
    batches: int | None = None  # resampled: batches this rank takes per epoch, shared over the workers
    interleave: int = 4  # resampled: shards each worker reads at once, so every batch mixes shards
    collate_fn: Callable | None = None  # how samples become a batch (default: stack uint8 images)
    state_file: str = ""  # per-epoch settings for persistent workers (epochstate.EpochStateFile)
    skip_keys: frozenset = frozenset()  # consumed before a mid-epoch checkpoint: read, never decoded
    resume_tag: str = ""  # a resumed resampled epoch draws fresh shards, deterministically
    queue: ShardClaims | None = None  # a shard queue (shard_queue.StoreQueue / LocalQueue) for --mode queue
    repeat: int = 1  # split mode: read this worker's shard list this many times per epoch
    crop_size: int = 0  # this epoch's train crop size, set on `transform` (0: the transform's own)
    num_classes: int = 0  # labels from 0 to num_classes - 1 are used, others are corrupt samples (0: any)
    ra_reps: int = 1  # split/queue: repeated augmentation (plan.repeated_order)
    max_corrupt_streak: int = MAX_CORRUPT_STREAK  # corrupt samples in a row that stop a worker (stages.decoded)

    def __post_init__(self):
        self.damage = DamageCounters(worker_context())
        self.outages = outage_tally.OutageTally(worker_context())  # retries and outage seconds, for /metrics
        self.environment = storage.io_environment()

    def epoch_state(self) -> EpochState:
        """This epoch's settings, for workers started in an earlier epoch."""
        return EpochState(self.epoch, self.skip_keys, self.resume_tag, self.batches, self.crop_size)

    def adopt(self, state: EpochState) -> None:
        """Take over the epoch's settings written by the training process."""
        self.epoch, self.skip_keys, self.resume_tag, self.batches, self.crop_size = (
            state.epoch,
            state.skip_keys,
            state.resume_tag,
            state.batches,
            state.crop_size,
        )

    def shard_urls(self, worker: int, workers: int, reader: int = 0) -> Iterator[str]:
        """The shards worker `worker` of `workers` reads this epoch (`reader`: one of its interleaved streams)."""
        if self.resampled:
            stream = f":{reader}" if reader else ""
            rng = random.Random(f"{self.seed}:{self.epoch}:{self.rank}:{worker}{self.resume_tag}{stream}")
            while True:
                yield self.urls[rng.randrange(len(self.urls))]
        order = plan.repeated_order(
            plan.epoch_order(len(self.urls), self.seed, self.epoch) if self.shuffle_shards else range(len(self.urls)),
            self.ra_reps,
        )
        if self.queue is not None:
            # Without a shard of its own to start with, a rank whose workers start late found every shard of a
            # small epoch claimed and took no step (and rank 0 alone writes the mid-epoch checkpoints).
            position = queue_first_shard(self.rank, self.world, worker, workers)
            while position < len(order):
                yield self.urls[order[position]]
                position = self.world * workers + self.queue.claim(self.epoch)
            return
        for _ in range(self.repeat):
            for shard in plan.worker_shards(list(order), self.rank, self.world, worker, workers):
                yield self.urls[shard]

    def __iter__(self) -> Iterator[Batch]:
        worker, workers = _worker()
        if get_worker_info() is not None:
            # A loader worker's outages are its loader's. Not in the main process (--workers 0): the results
            # mirror's and the checkpoints' retries happen there between batches, and are no loader's.
            outage_tally.count_into(self.outages)
            storage.apply_io_environment(self.environment)
            if self.state_file:
                self.adopt(read_epoch_state(self.state_file))
        rng = random.Random(f"{self.seed}:{self.epoch}:{self.rank}:{worker}:samples")
        if self.resampled:
            # Several shards open at once, drawn from at random, so each batch mixes shards in this worker.
            max_empty = 2 * len(self.urls) + 8
            readers = [
                read_shards(self.shard_urls(worker, workers, reader), self.reading, self.damage, max_empty)
                for reader in range(max(self.interleave, 1))
            ]
            samples = interleaved(readers, random.Random(f"{self.seed}:{self.epoch}:{self.rank}:{worker}:mix"))
        else:
            samples = read_shards(self.shard_urls(worker, workers), self.reading, self.damage, None)
        if self.skip_keys:
            samples = (sample for sample in samples if sample["__key__"] not in self.skip_keys)
        if self.shuffle_buffer > 1:
            samples = shuffled(samples, self.shuffle_buffer, rng)
        batches = batched(
            decoded(
                samples, at_size(self.transform, self.crop_size), self.damage, self.num_classes, self.max_corrupt_streak
            ),
            self.batch_size,
            partial=not self.resampled,
            collate_fn=self.collate_fn or collate,
            at_most=self.samples_at_most(worker, workers),
        )
        if self.resampled and self.batches:
            # The DataLoader takes batches from its workers in turn: worker w's share of the epoch, exactly.
            share = self.batches // workers + (worker < self.batches % workers)
            return itertools.islice(batches, share)
        return batches

    def samples_at_most(self, worker: int, workers: int) -> int | None:
        """Split mode: at most what this worker's shards yield undamaged (None in queue mode: claimed as it goes)."""
        if self.resampled or self.queue is not None:
            return None
        sizes = {url: shard.samples for url, shard in self.reading.expected.items()}
        return index_bound(list(self.shard_urls(worker, workers)), sizes, len(self.skip_keys))

    def rank_shards(self) -> int:
        """How many shards this rank reads in split mode."""
        return len(plan.assigned(range(len(self.urls)), self.rank, self.world))


class EpochLoader:
    """Iterate one epoch of batches at a time; resampled streams are cut to exactly `batches` per rank.

    The DataLoader and its worker processes are made once and persist across epochs (`persistent`), so an
    epoch starts without worker start-up; each epoch's settings reach the workers through a state file.
    """

    def __init__(
        self,
        stream: ShardStream,
        workers: int,
        batches: int | None = None,
        pin_memory: bool = False,
        timeout: float = 0,
        persistent: bool = True,
        crop_sizes: Callable[[int], int] | None = None,
    ):
        if stream.resampled and not batches:
            raise ImagenetTrainError("resampled loading needs an epoch length in batches")
        self.stream, self.batches = stream, batches
        # The train crop size of each epoch (planning.resolution.CropSchedule); None: the transform's own.
        self.crop_sizes = crop_sizes
        self._set_epoch(stream.epoch)
        dynamic = stream.resampled or stream.queue is not None
        self.workers = workers if dynamic else plan.loader_workers(stream.rank_shards(), workers)
        self.pin_memory, self.timeout, self.persistent = pin_memory, timeout, persistent and self.workers > 0
        self.state: EpochStateFile | None = None  # made on the first epoch, removed by close()
        self.loader: DataLoader | None = None
        if self.workers:
            start_worker_server()  # its imports run while the caller goes on to its first epoch

    def set_epoch(self, epoch: int) -> None:
        """Read `epoch` next (its order, draws and crop size), with this loader's other epoch settings unchanged."""
        self._set_epoch(epoch)

    def _set_epoch(self, epoch: int) -> None:
        self.stream.epoch = epoch
        self.stream.crop_size = self.crop_sizes(epoch) if self.crop_sizes else 0

    @property
    def crop_size(self) -> int:
        """The coming epoch's train crop size (0: the transform's own, not scheduled)."""
        return self.stream.crop_size

    def epoch_report(self) -> dict[str, int]:
        """What the coming epoch's metrics record about its loading: `train_crop_size` when it is scheduled."""
        return {"train_crop_size": self.crop_size} if self.crop_size else {}

    def start_epoch(
        self, epoch: int, skip_keys: Iterable[str] = (), resume_tag: str = "", batches: int | None = None
    ) -> None:
        """Set up the next epoch: from its start, or what is left of it when resuming inside it.

        `skip_keys`: samples an interrupted run already consumed (read, never decoded); `resume_tag` makes a
        resumed resampled epoch draw fresh shards; `batches` caps the epoch (None: until the data runs out).
        The settings reach persistent workers when the epoch is iterated.
        """
        self._set_epoch(epoch)
        self.stream.skip_keys, self.stream.resume_tag = frozenset(skip_keys), resume_tag
        self.batches = batches

    @property
    def corrupt_samples(self) -> int:
        """Undecodable samples this rank's workers skipped so far."""
        return self.stream.damage.snapshot()[DamageCounters.CORRUPT]

    def damage(self) -> tuple[int, int, int]:
        """(corrupt samples, broken shards, lost samples) this rank's workers met so far."""
        return self.stream.damage.snapshot()

    def outages(self) -> tuple[int, float]:
        """(I/O retries, seconds in outages) this rank's workers met so far."""
        return self.stream.outages.snapshot()

    def _data_loader(self) -> DataLoader:
        if self.loader is None or not self.persistent:
            self.loader = DataLoader(
                self.stream,
                batch_size=None,
                num_workers=self.workers,
                pin_memory=self.pin_memory,
                prefetch_factor=4 if self.workers else None,
                persistent_workers=self.persistent,
                multiprocessing_context=worker_context() if self.workers else None,
                timeout=self.timeout if self.workers else 0,
                worker_init_fn=worker_init if self.workers else None,
            )
        return self.loader

    def __iter__(self) -> Iterator[Batch]:
        self.stream.batches = self.batches if self.stream.resampled else None
        if self.workers:
            if self.state is None:
                self.state = EpochStateFile()
                self.stream.state_file = self.state.path
            self.state.write(self.stream.epoch_state())
        with main_script_hidden():
            batches = iter(self._data_loader())  # starts the workers (the first time, when they persist)
        track_workers(batches)
        try:
            yield from itertools.islice(batches, self.batches) if self.batches else batches
        except RuntimeError as error:
            if "timed out" not in str(error):
                raise
            raise ImagenetTrainError(
                f"data loading: no batch from the DataLoader workers within {self.timeout:.0f}s "
                f"(first shard {self.stream.urls[0]}); is the shard server stalled?"
            ) from None
        finally:
            if not self.persistent:
                stop_workers(batches)

    def close(self) -> None:
        """Stop the persistent workers and remove the epoch state (both also go when the loader is collected)."""
        if self.loader is not None:
            stop_workers(getattr(self.loader, "_iterator", None))
            self.loader = None
        if self.state is not None:
            self.state.close()
            self.state = None
