"""Input pipelines for DDP: urls → shard split → tar samples → shuffle → decode+augment → batch."""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import random
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import storage, tarstream
from imagenet_train.io.cache import open_cached, open_verified
from imagenet_train.io.integrity import DigestMismatch, VerifyingReader
from imagenet_train.loading.epochstate import EpochState, EpochStateFile, read_epoch_state
from imagenet_train.planning import plan

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor, list]


class BrokenShard(Exception):
    """A shard whose bytes end or go wrong partway: what came before the damage is still good."""


def samples_in_tar(stream, url: str) -> Iterator[dict]:
    """Group a tar stream's consecutive members by key into WebDataset samples."""
    sample: dict | None = None
    complete: set[str] = set()  # the members a whole sample of this shard has
    try:
        for member, data in tarstream.members(stream):
            name = member.rsplit("/", 1)[-1]
            key, _, extension = name.partition(".")
            prefix = member[: len(member) - len(name)] + key
            if sample is None or sample["__key__"] != prefix:
                if sample is not None:
                    complete = complete or set(sample)
                    yield sample
                sample = {"__key__": prefix, "__url__": url}
            sample[extension.lower()] = data
    except tarstream.TarFormatError as error:
        # The sample being assembled counts if the damage lies in the next one, or it has every member.
        damaged = error.member.rsplit("/", 1)[-1].partition(".")[0] if error.member else None
        pending_key = sample["__key__"].rsplit("/", 1)[-1] if sample else None
        if sample is not None and ((damaged and damaged != pending_key) or (complete and set(sample) >= complete)):
            yield sample
        raise BrokenShard(str(error)) from None
    if sample is not None:
        yield sample


@dataclass(frozen=True)
class ShardInfo:
    """What the index says one shard holds."""

    samples: int
    filesize: int | None = None
    sha256: str | None = None


def expected_shards(index, splits: Iterable[str]) -> dict[str, ShardInfo]:
    """What a loaded shard index (datasets.index.ShardIndex) says each shard of `splits` holds, by URL."""
    return {
        url: ShardInfo(samples, filesize, sha256)
        for split in splits
        for url, samples, filesize, sha256 in zip(
            index.urls(split), index.sizes(split), index.filesizes(split), index.checksums(split), strict=True
        )
    }


class DamageCounters:
    """Damage tallies shared by one rank's DataLoader workers: undecodable samples, broken shards and the
    samples those shards lost."""

    CORRUPT, BROKEN, LOST = range(3)

    def __init__(self, context: multiprocessing.context.BaseContext):
        self.values = context.Array("q", 3)

    def add(self, which: int, count: int = 1) -> None:
        with self.values.get_lock():
            self.values[which] += count

    def snapshot(self) -> tuple[int, int, int]:
        """(corrupt samples, broken shards, lost samples) so far."""
        with self.values.get_lock():
            return tuple(self.values)  # type: ignore[return-value]


_reported: set[tuple[str, str]] = set()  # (shard, message) pairs this process already warned about


def _warn_once(url: str, message: str, *args) -> None:
    if (url, message) not in _reported:
        _reported.add((url, message))
        log.warning(message, url, *args)


_mismatched: set[str] = set()  # shards this process found not to match their index: never read again


@dataclass(frozen=True)
class ShardReading:
    """How a rank's workers read shards: the I/O budget, what to do with damage, and what to expect.

    `verify`: check each shard against the sha256 (and size) its index records. Without a cache the bytes
    are hashed as they are read, so a mismatch is known only at the shard's end, after its samples were
    yielded; holding a whole shard back (~100s of MB per open shard, 4 per worker when resampled) is not an
    option. The shard is then counted broken, named in a warning (a hard error under --on-broken-shard fail)
    and never read again by this process. With --cache-dir, a remote shard is fetched whole into the cache
    and checked before any sample is read from it (MosaicML streaming and FFCV do the same), at the price of
    no longer overlapping the first download of each shard with its decoding.
    """

    io_timeout: float = 900.0
    on_broken: str = "skip"
    expected: Mapping[str, ShardInfo] = field(default_factory=dict)
    cache_dir: str = ""
    verify: bool = True

    def checksum(self, url: str) -> str | None:
        """The sha256 to check `url` against, or None when not verifying or the index records none."""
        expected = self.expected.get(url)
        return expected.sha256 if self.verify and expected else None

    def cached(self, url: str) -> bool:
        """Whether `url` is read through the node-local cache."""
        return bool(self.cache_dir) and storage.is_url(url)

    def open(self, url: str):
        """The shard's bytes: from the cache (checked before use when verifying), or straight from `url`."""
        remote = lambda u: storage.open_stream(u, self.io_timeout)  # noqa: E731
        if self.cached(url):
            sha256 = self.checksum(url)
            if sha256:
                return open_verified(url, self.cache_dir, remote, sha256, self.expected[url].filesize)
            return open_cached(url, self.cache_dir, remote)
        return storage.open_stream(url, self.io_timeout)


def read_shards(
    urls: Iterable[str],
    reading: ShardReading = ShardReading(),
    counters: DamageCounters | None = None,
    max_empty: int | None = None,
) -> Iterator[dict]:
    """Samples of each shard in turn. An outage is waited out (`reading.io_timeout`); a broken shard keeps the
    samples before the damage and, unless `reading.on_broken` is "fail", the stream goes on with the next one.

    `max_empty` bounds how many shards in a row may yield nothing, so an endless resampled stream over
    unusable shards fails instead of spinning forever.
    """
    empty = 0
    for url in urls:
        expected = reading.expected.get(url)
        sha256 = reading.checksum(url)
        count = 0
        try:
            if sha256 and url in _mismatched:
                raise DigestMismatch("did not match its index's sha256 when read before; not read again")
            with reading.open(url) as stream:
                size = storage.stream_size(stream)
                if expected and expected.filesize and size is not None and size != expected.filesize:
                    _warn_once(url, "shard %s is %d bytes; the index says %d", size, expected.filesize)
                # A cached shard was checked before it was opened; any other is hashed while it is read.
                verifying = None
                if sha256 and not reading.cached(url):
                    verifying = VerifyingReader(stream, sha256, expected.filesize if expected else None)
                for sample in samples_in_tar(verifying or stream, url):
                    count += 1
                    yield sample
                if verifying:
                    verifying.finish()
        except (BrokenShard, DigestMismatch) as error:
            if isinstance(error, DigestMismatch) and sha256:
                _mismatched.add(url)
            if reading.on_broken == "fail":
                raise ImagenetTrainError(f"{url}: broken shard ({error}; --on-broken-shard fail)") from None
            lost = max(0, expected.samples - count) if expected else 0
            if counters:
                counters.add(DamageCounters.BROKEN)
                counters.add(DamageCounters.LOST, lost)
            if isinstance(error, DigestMismatch) and count:
                _warn_once(
                    url,
                    "broken shard %s: %s; its %d samples were ALREADY USED (the mismatch shows only at the "
                    "shard's end; --cache-dir checks every shard before use), lost %d",
                    error,
                    count,
                    lost,
                )
            else:
                _warn_once(
                    url, "broken shard %s: %s; kept %d samples, lost %s", error, count, lost if expected else "unknown"
                )
        empty = 0 if count else empty + 1
        if max_empty is not None and empty >= max_empty:
            raise ImagenetTrainError(f"{url}: {empty} shards in a row held no samples; check the shard list")


def shuffled(items: Iterable, buffer: int, rng: random.Random) -> Iterator:
    """Shuffle a stream through a buffer of `buffer` items."""
    pool: list = []
    for item in items:
        if len(pool) < buffer:
            pool.append(item)
            continue
        slot = rng.randrange(len(pool))
        yield pool[slot]
        pool[slot] = item
    rng.shuffle(pool)
    yield from pool


def interleaved(streams: Sequence[Iterator], rng: random.Random) -> Iterator:
    """Items of several streams, each next item from one of them drawn at random, until all are done."""
    active = list(streams)
    while active:
        slot = rng.randrange(len(active))
        try:
            yield next(active[slot])
        except StopIteration:
            active.pop(slot)


def decoded(samples: Iterable[dict], transform: Callable, counters: DamageCounters) -> Iterator[tuple]:
    """(uint8 image, label, key) per sample from `transform(jpeg bytes)`; undecodable samples are skipped,
    logged and counted."""
    for sample in samples:
        try:
            image = transform(sample["jpg"])
            label = int(sample["cls"])
        except Exception as error:  # any bad sample: PIL, libjpeg and parsing errors alike
            counters.add(DamageCounters.CORRUPT)
            log.warning(
                "skipping corrupt sample %s in %s: %s",
                sample.get("__key__"),
                sample.get("__url__"),
                error if not isinstance(error, KeyError) else f"missing {error}",
            )
            continue
        yield image, label, sample["__key__"]


def collate(samples: Sequence[tuple]) -> Batch:
    """Stack (image, label, key) samples into (images, labels, keys).

    In a DataLoader worker the batch is stacked straight into shared memory (as torch's default_collate
    does), instead of being copied there again when it is sent to the training process.
    """
    first = samples[0][0]
    out = None
    if get_worker_info() is not None:
        storage = first._typed_storage()._new_shared(first.numel() * len(samples), device=first.device)
        out = first.new(storage).resize_(len(samples), *first.shape)
    images = torch.stack([s[0] for s in samples], out=out)
    labels = torch.tensor([int(s[1]) for s in samples], dtype=torch.int64)
    return images, labels, [s[2] for s in samples]


def batched(samples: Iterable, batch_size: int, partial: bool, collate_fn: Callable = collate) -> Iterator:
    """Group samples into batches; the last short batch is kept only when `partial`.

    A lone sample left over at the end joins the last full batch instead (plan.batches_for agrees): a batch
    of one cannot train BatchNorm.
    """
    pending: list = []
    held: list | None = None  # the last full batch, held back until we know whether one sample follows
    for sample in samples:
        pending.append(sample)
        if len(pending) == batch_size:
            if held is not None:
                yield collate_fn(held)
            held, pending = pending, []
    if partial and len(pending) == 1 and held is not None:
        held, pending = held + pending, []
    if held is not None:
        yield collate_fn(held)
    if pending and partial:
        yield collate_fn(pending)


def worker_context() -> multiprocessing.context.BaseContext:
    """Where DataLoader workers come from: a clean forkserver, never a fork of the training process.

    Forking a rank that already runs gloo/NCCL and tqdm threads can deadlock the child inside fork
    (seen here: a val worker stuck before it started, its rank waiting forever, the peer rank
    blocked in all_reduce). The forkserver preloads this module, so workers still start fast.
    """
    context = multiprocessing.get_context("forkserver")
    if not _preloaded:
        start_resource_tracker()
        context.set_forkserver_preload(["imagenet_train.loading.loader_signals", __name__])
        _preloaded.append(True)
    return context


_preloaded: list = []


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker deaf to SIGUSR1, as it already is to SIGINT and SIGTERM.

    Slurm sends its pre-emption signal to every process of a job step: a tracker killed by it is relaunched
    while the rank shuts its loaders down, prints a KeyError traceback per semaphore and can no longer clean
    up. A signal blocked while the tracker starts stays blocked in it (the mask survives fork and exec).
    """
    from multiprocessing import resource_tracker

    if not hasattr(signal, "pthread_sigmask"):
        resource_tracker.ensure_running()
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def main_script_hidden() -> Iterator[None]:
    """Start worker processes without the `__main__` script, so loaders work from any script or notebook.

    multiprocessing has each forkserver child run the main script again (as `__mp_main__`): a script that
    builds a loader at top level, without an `if __name__ == "__main__":` guard, would start over in every
    worker and the workers would die. Worker code lives in this package and never needs `__main__`.
    """
    main = sys.modules["__main__"]
    script = main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        if script is not None:
            main.__file__ = script


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies.

    A rank killed outright (OOM killer, SIGKILL) cannot shut its loader down; without this its
    forkserver and DataLoader workers live on, each holding hundreds of MB. The forkserver dies with
    its rank, the workers with their forkserver (PyTorch's own watchdog only sees the forkserver).
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before the request took effect
            os._exit(1)


if "multiprocessing.forkserver" in " ".join(getattr(sys, "orig_argv", [])):
    die_with_parent()  # imported as the forkserver's preload: this process is the forkserver


def _worker_init(_: int) -> None:
    die_with_parent()
    from imagenet_train.loading import loader_signals  # noqa: F401 (its import sets the dispositions; also without a forkserver)


def _worker() -> tuple[int, int]:
    info = get_worker_info()
    return (info.id, info.num_workers) if info else (0, 1)


@dataclass
class ShardStream(IterableDataset):
    """One rank's stream of batches, built in each DataLoader worker.

    `resampled`: each worker draws shards at random with replacement, forever (the loader sets the
    epoch length). With a `queue`, workers claim the next shard of the epoch's order at run time.
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
    queue: object = None  # a shard queue (queue.StoreQueue / LocalQueue) for --mode queue
    repeat: int = 1  # split mode: read this worker's shard list this many times per epoch

    def __post_init__(self):
        self.damage = DamageCounters(worker_context())
        self.environment = storage.io_environment()

    def epoch_state(self) -> EpochState:
        """This epoch's settings, for workers started in an earlier epoch."""
        return EpochState(self.epoch, self.skip_keys, self.resume_tag, self.batches)

    def adopt(self, state: EpochState) -> None:
        """Take over the epoch's settings written by the training process."""
        self.epoch, self.skip_keys, self.resume_tag, self.batches = (
            state.epoch,
            state.skip_keys,
            state.resume_tag,
            state.batches,
        )

    def shard_urls(self, worker: int, workers: int, reader: int = 0) -> Iterator[str]:
        if self.resampled:
            stream = f":{reader}" if reader else ""
            rng = random.Random(f"{self.seed}:{self.epoch}:{self.rank}:{worker}{self.resume_tag}{stream}")
            while True:
                yield self.urls[rng.randrange(len(self.urls))]
        order = (
            plan.epoch_order(len(self.urls), self.seed, self.epoch) if self.shuffle_shards else range(len(self.urls))
        )
        if self.queue is not None:
            while (position := self.queue.claim(self.epoch)) < len(self.urls):
                yield self.urls[order[position]]
            return
        for _ in range(self.repeat):
            for shard in plan.worker_shards(list(order), self.rank, self.world, worker, workers):
                yield self.urls[shard]

    def __iter__(self) -> Iterator[Batch]:
        worker, workers = _worker()
        if get_worker_info() is not None:
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
            decoded(samples, self.transform, self.damage),
            self.batch_size,
            partial=not self.resampled,
            collate_fn=self.collate_fn or collate,
        )
        if self.resampled and self.batches:
            # The DataLoader takes batches from its workers in turn: worker w's share of the epoch, exactly.
            share = self.batches // workers + (worker < self.batches % workers)
            return itertools.islice(batches, share)
        return batches

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
    ):
        if stream.resampled and not batches:
            raise ImagenetTrainError("resampled loading needs an epoch length in batches")
        self.stream, self.batches = stream, batches
        dynamic = stream.resampled or stream.queue is not None
        self.workers = workers if dynamic else plan.loader_workers(stream.rank_shards(), workers)
        self.pin_memory, self.timeout, self.persistent = pin_memory, timeout, persistent and self.workers > 0
        self.state: EpochStateFile | None = None  # made on the first epoch, removed by close()
        self.loader: DataLoader | None = None

    def set_epoch(self, epoch: int) -> None:
        self.stream.epoch = epoch

    @property
    def corrupt_samples(self) -> int:
        return self.stream.damage.snapshot()[DamageCounters.CORRUPT]

    def damage(self) -> tuple[int, int, int]:
        """(corrupt samples, broken shards, lost samples) this rank's workers met so far."""
        return self.stream.damage.snapshot()

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
                worker_init_fn=_worker_init if self.workers else None,
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
                _shutdown(batches)

    def close(self) -> None:
        """Stop the persistent workers and remove the epoch state (both also go when the loader is collected)."""
        if self.loader is not None:
            _shutdown(getattr(self.loader, "_iterator", None))
            self.loader = None
        if self.state is not None:
            self.state.close()
            self.state = None


def _shutdown(batches) -> None:
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown:
        shutdown()
    for worker in getattr(batches, "_workers", []):
        if worker.is_alive():  # it ignores SIGTERM (loader_signals), so torch's terminate() cannot end it
            worker.kill()
            worker.join(timeout=5)


@dataclass(frozen=True)
class DataSource:
    """Where the shards are and how big the splits are."""

    train_urls: list[str]
    val_urls: list[str]
    train_sizes: list[int] | None
    train_samples: int
    num_classes: int
    expected: Mapping[str, ShardInfo] = field(default_factory=dict)  # per URL, from the index


def expand_urls(spec: str) -> list[str]:
    """A WebDataset URL spec (brace notation, `::`-separated lists) as a list of URLs."""
    from braceexpand import braceexpand

    return [url for part in spec.split("::") if part for url in braceexpand(part)]


def resolve_source(
    shards: str,
    train_urls: str = "",
    val_urls: str = "",
    train_samples: int = 0,
    num_classes: int = 0,
    io_timeout: float = 900.0,
    trust_index: bool = False,
) -> DataSource:
    """Read the shard index (or take explicit URL specs) into lists of URLs and counts.

    The index's shard URLs must lie in its own folder unless `trust_index`; URL specs the user gives
    (`--train-urls`, pipe: included) are the user's own and used as given.
    """
    from imagenet_train.datasets.index import load_index

    if shards:
        index = load_index(shards, io_timeout=io_timeout, trust_index=trust_index)
        sizes = index.sizes("train")
        splits = [split for split in ("train", "val") if split in index.splits()]
        expected = expected_shards(index, splits)
        return DataSource(
            train_urls=index.urls("train"),
            val_urls=index.urls("val") if "val" in splits else [],
            train_sizes=sizes,
            train_samples=sum(sizes),
            num_classes=num_classes or len(index.classes),
            expected=expected,
        )
    if num_classes < 1:
        raise ImagenetTrainError("--num-classes: required when shards are given as --train-urls")
    urls = expand_urls(train_urls)
    if not urls:
        raise ImagenetTrainError(f"--train-urls: '{train_urls}' names no shards")
    return DataSource(urls, expand_urls(val_urls), None, train_samples, num_classes)
