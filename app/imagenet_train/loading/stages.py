"""The loader's generator stages, each a small step testable alone: shard bytes to tar samples (verified
against the index), shuffle, interleave, decode, batch."""

from __future__ import annotations

import logging
import multiprocessing
import random
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field, replace
from typing import BinaryIO, cast

from imagenet_train.choices import BrokenShardPolicy
from imagenet_train.datasets.pixels import CorruptImage
from imagenet_train.datasets.source import ShardInfo
from imagenet_train.errors import ImagenetTrainError, clip, visible
from imagenet_train.io import storage, tarstream
from imagenet_train.io.cache import CheckedCopy, open_cached, open_verified
from imagenet_train.io.integrity import DigestMismatch, VerifyingReader
from imagenet_train.io.pipe import CommandFailed
from imagenet_train.limits import IO_TIMEOUT, MAX_CORRUPT_STREAK
from imagenet_train.shared_tally import SharedTally

log = logging.getLogger(__name__)


class BrokenShard(Exception):
    """A shard whose bytes end or go wrong partway: what came before the damage is still good."""


# A sample is a few members (an image, a class, maybe metadata); each member is bounded by the tar reader,
# and these bound what one sample holds in memory in total.
MAX_SAMPLE_MEMBERS = 64
MAX_SAMPLE_BYTES = 96 << 20


def samples_in_tar(stream, url: str) -> Iterator[dict]:
    """Group a tar stream's consecutive members by key into WebDataset samples."""
    sample: dict | None = None
    complete: set[str] = set()  # the members a whole sample of this shard has
    held = 0
    try:
        for member, data in tarstream.members(stream):
            name = member.rsplit("/", 1)[-1]
            key, _, extension = name.partition(".")
            prefix = member[: len(member) - len(name)] + key
            if sample is None or sample["__key__"] != prefix:
                if sample is not None:
                    complete = complete or set(sample)
                    yield sample
                sample, held = {"__key__": prefix, "__url__": url}, 0
            sample[extension.lower()] = data
            held += len(data)
            if held > MAX_SAMPLE_BYTES or len(sample) > MAX_SAMPLE_MEMBERS + 2:
                raise BrokenShard(
                    f"sample {prefix[:80]!r}: its members pass {MAX_SAMPLE_MEMBERS} or "
                    f"{MAX_SAMPLE_BYTES >> 20} MiB in all"
                )
    except tarstream.TarFormatError as error:
        # The sample being assembled counts if the damage lies in the next one, or it has every member.
        damaged = error.member.rsplit("/", 1)[-1].partition(".")[0] if error.member else None
        pending_key = sample["__key__"].rsplit("/", 1)[-1] if sample else None
        if sample is not None and ((damaged and damaged != pending_key) or (complete and set(sample) >= complete)):
            yield sample
        raise BrokenShard(str(error)) from None
    if sample is not None:
        yield sample


class DamageCounters(SharedTally):
    """Damage tallies shared by one rank's DataLoader workers: undecodable samples, broken shards and the
    samples those shards lost."""

    CORRUPT, BROKEN, LOST = range(3)

    def __init__(self, context: multiprocessing.context.BaseContext):
        super().__init__(context, "q", 3)

    def add(self, which: int, count: int = 1) -> None:
        """Count `count` more of tally `which` (CORRUPT, BROKEN or LOST)."""
        self.increase((which, count))

    def snapshot(self) -> tuple[int, int, int]:
        """(corrupt samples, broken shards, lost samples) so far."""
        corrupt, broken, lost = self.read()
        return corrupt, broken, lost


_reported: set[tuple[str, str]] = set()  # (shard, message) pairs this process already warned about


def _warn_once(url: str, message: str, *args) -> None:
    if (url, message) not in _reported:
        _reported.add((url, message))
        # The shard's own words (a member name in a tar error) reach the log with their control characters visible.
        shown = [visible(str(arg)) if isinstance(arg, str | BaseException) else arg for arg in args]
        log.warning(message, visible(url), *shown)


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

    io_timeout: float = IO_TIMEOUT
    on_broken: str = BrokenShardPolicy.SKIP.value
    expected: Mapping[str, ShardInfo] = field(default_factory=dict)
    cache_dir: str = ""
    verify: bool = True
    cache_max_bytes: int = 0

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
                size = self.expected[url].filesize
                return open_verified(url, self.cache_dir, remote, sha256, size, self.cache_max_bytes)
            return open_cached(url, self.cache_dir, remote, self.cache_max_bytes, storage.stream_size)
        return storage.open_stream(url, self.io_timeout)


@dataclass(frozen=True)
class Shard:
    """One shard on its way through the stages: its url, what its index expects of it, and once opened its
    bytes (`verifier`: the reader that hashes them as they are read, when the cache did not check them)."""

    url: str
    expected: ShardInfo | None = None
    sha256: str | None = None  # the digest to check, only when verifying
    stream: BinaryIO | VerifyingReader | None = None
    verifier: VerifyingReader | None = None


def as_damage(error: BrokenShard | DigestMismatch | CommandFailed) -> BrokenShard | DigestMismatch:
    """A failed `pipe:` command as the shard damage it is: its bytes end, or went wrong, partway."""
    return BrokenShard(error.reason) if isinstance(error, CommandFailed) else error


class ShardOutcomes:
    """What becomes of each shard read: a broken one is counted and named once in a warning (or ends the run
    under --on-broken-shard fail), and `max_empty` shards in a row with no sample end the stream, so an
    endless resampled stream over unusable shards fails instead of spinning forever."""

    def __init__(self, reading: ShardReading, counters: DamageCounters | None = None, max_empty: int | None = None):
        self.reading, self.counters, self.max_empty = reading, counters, max_empty
        self.empty = 0  # shards in a row that held no sample

    def broken(self, shard: Shard, error: BrokenShard | DigestMismatch, count: int) -> None:
        """`shard` broke after `count` samples: remember a digest mismatch, then fail, or count and warn."""
        url, expected = shard.url, shard.expected
        if isinstance(error, DigestMismatch) and shard.sha256:
            _mismatched.add(url)
        if self.reading.on_broken == BrokenShardPolicy.FAIL:
            raise ImagenetTrainError(f"{url}: broken shard ({error}; --on-broken-shard fail)") from None
        lost = max(0, expected.samples - count) if expected else 0
        if self.counters:
            self.counters.add(DamageCounters.BROKEN)
            self.counters.add(DamageCounters.LOST, lost)
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

    def done(self, shard: Shard, count: int) -> None:
        """`shard` gave `count` samples: raise when it ends a run of `max_empty` shards without any."""
        self.empty = 0 if count else self.empty + 1
        if self.max_empty is not None and self.empty >= self.max_empty:
            raise ImagenetTrainError(f"{shard.url}: {self.empty} shards in a row held no samples; check the shard list")


def shards_of(urls: Iterable[str], reading: ShardReading) -> Iterator[Shard]:
    """Each url with what its index expects of it (its sha256 only when verifying)."""
    for url in urls:
        yield Shard(url, reading.expected.get(url), reading.checksum(url))


def opened(shards: Iterable[Shard], reading: ShardReading, outcomes: ShardOutcomes) -> Iterator[Shard]:
    """URL opener: each shard with its bytes, from the cache (checked before use) or from its url, closed when
    the next one is asked for. A shard that failed its sha256 check before in this process is not read again."""
    for shard in shards:
        try:
            if shard.sha256 and shard.url in _mismatched:
                raise DigestMismatch("did not match its index's sha256 when read before; not read again")
            stream = reading.open(shard.url)
        except (DigestMismatch, CommandFailed) as error:  # CommandFailed: the cache's whole copy of a pipe: shard
            outcomes.broken(shard, as_damage(error), 0)
            outcomes.done(shard, 0)
            continue
        with stream:
            yield replace(shard, stream=stream)


def size_checked(shards: Iterable[Shard]) -> Iterator[Shard]:
    """Warn once about a shard whose size differs from the one its index records (its sha256 check fails it)."""
    for shard in shards:
        size = storage.stream_size(shard.stream)
        expected = shard.expected
        if expected and expected.filesize and size is not None and size != expected.filesize:
            _warn_once(shard.url, "shard %s is %d bytes; the index says %d", size, expected.filesize)
        yield shard


def hashed(shards: Iterable[Shard], reading: ShardReading) -> Generator[Shard, None, None]:
    """Each shard the cache did not check, read through a VerifyingReader that hashes its bytes on the way
    (the tar expander checks the digest at the shard's end)."""
    for shard in shards:
        if shard.sha256 and not isinstance(shard.stream, CheckedCopy):
            size = shard.expected.filesize if shard.expected else None
            stream = cast(tarstream.Readable, shard.stream)  # opened() set it
            verifier = VerifyingReader(stream, shard.sha256, size)
            shard = replace(shard, stream=verifier, verifier=verifier)
        yield shard


def expanded(shards: Iterable[Shard], outcomes: ShardOutcomes) -> Iterator[dict]:
    """Tar expander: the samples of each shard in turn. A broken shard keeps the samples before the damage and
    goes to `outcomes`, as does a digest mismatch found at its end, after its samples."""
    for shard in shards:
        count = 0
        try:
            for sample in samples_in_tar(shard.stream, shard.url):
                count += 1
                yield sample
            if shard.verifier:
                shard.verifier.finish()
        except (BrokenShard, DigestMismatch, CommandFailed) as error:
            outcomes.broken(shard, as_damage(error), count)
        outcomes.done(shard, count)


def read_shards(
    urls: Iterable[str],
    reading: ShardReading = ShardReading(),
    counters: DamageCounters | None = None,
    max_empty: int | None = None,
) -> Iterator[dict]:
    """Samples of each shard in turn. An outage is waited out (`reading.io_timeout`); a broken shard keeps the
    samples before the damage and, unless `reading.on_broken` is "fail", the stream goes on with the next one.

    The stages: url opener (through the cache), size check, hashing reader, tar expander; `max_empty` bounds
    how many shards in a row may yield nothing (ShardOutcomes).
    """
    outcomes = ShardOutcomes(reading, counters, max_empty)
    shards = hashed(size_checked(opened(shards_of(urls, reading), reading, outcomes)), reading)
    with closing(shards):  # the open shard is closed at once when the stream ends, fails or is dropped
        yield from expanded(shards, outcomes)


# Items a shuffle buffer holds before its first item leaves (webdataset's `shuffle(bufsize, initial=100)`).
SHUFFLE_INITIAL = 100


def shuffled(items: Iterable, buffer: int, rng: random.Random, initial: int = SHUFFLE_INITIAL) -> Iterator:
    """Shuffle a stream through a buffer of `buffer` items that starts yielding once it holds `initial`.

    Waiting for a full buffer held back a cold epoch's first batch until 1,000 samples were read and hashed.
    From `initial` items on, the buffer yields one item for every two it reads until it is full, then one for
    each, as webdataset's shuffle does: its first items are drawn from fewer (at least `initial`), later ones
    from `buffer`. The order depends only on the stream and `rng` (`initial` >= `buffer`: wait for a full buffer).
    """
    pool: list = []
    start = min(initial, buffer)
    for read, item in enumerate(items, 1):
        if len(pool) >= buffer:
            slot = rng.randrange(len(pool))
            yield pool[slot]
            pool[slot] = item
            continue
        pool.append(item)
        if len(pool) >= start and read % 2 == 0 and len(pool) < buffer:
            slot = rng.randrange(len(pool))
            pool[slot], pool[-1] = pool[-1], pool[slot]
            yield pool.pop()
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


class CorruptSample(ValueError):
    """A sample with a member missing or a .cls that is not a class of this dataset (counted, skipped)."""


def class_label(data: bytes, num_classes: int) -> int:
    """A sample's class from its .cls bytes: a whole number from 0 to `num_classes` - 1 (0: any int64 >= 0).

    A shard's label is untrusted: one out of range ends a step in the loss (a device-side assert on a GPU),
    one past int64 ends the collate; here either is a CorruptSample, counted and skipped.
    """
    if len(data) > 64:
        raise CorruptSample(f".cls of {len(data)} bytes; expected a class number")
    try:
        label = int(data)
    except ValueError:
        raise CorruptSample(f".cls {clip(data)}; expected a class number") from None
    top = num_classes or 1 << 63
    if not 0 <= label < top:
        raise CorruptSample(f"class {clip(label)} out of range; expected 0 to {top - 1}")
    return label


def decoded(
    samples: Iterable[dict],
    transform: Callable,
    counters: DamageCounters,
    num_classes: int = 0,
    max_streak: int = MAX_CORRUPT_STREAK,
) -> Iterator[tuple]:
    """(uint8 image, label, key) per sample from `transform(jpeg bytes)`.

    Damaged data is skipped, logged and counted: a missing member, a label outside 0..`num_classes`-1, an image
    that does not decode (CorruptImage). Any other error of the transform, which fails on every sample alike (a
    bug, a setting the augmentation cannot do), stops the run in one line naming the sample. So does data of which
    nothing decodes: `max_streak` corrupt samples in a row, or a stream that ends without one good sample (0: never).
    """
    streak = seen = 0
    damage: Exception | None = None  # the last corrupt sample's
    for sample in samples:
        key, url = sample.get("__key__"), sample.get("__url__")
        seen += 1
        try:
            missing = [member for member in ("jpg", "cls") if member not in sample]
            if missing:
                raise CorruptSample(f"missing .{missing[0]}")
            label = class_label(sample["cls"], num_classes)
            image = transform(sample["jpg"])
        except (CorruptImage, CorruptSample) as error:
            counters.add(DamageCounters.CORRUPT)
            log.warning("skipping corrupt sample %s in %s: %s", clip(key, 200), clip(url, 200), clip(str(error), 200))
            streak, damage = streak + 1, error
            if max_streak and streak >= max_streak:
                raise ImagenetTrainError(
                    _nothing_decodes(url, f"{streak} samples in a row are corrupt", error)
                ) from None
            continue
        except ImagenetTrainError:
            raise
        except Exception as error:
            raise ImagenetTrainError(
                f"sample {clip(key)} in {clip(url, 200)}: the transform failed after the image decoded "
                f"({clip(f'{type(error).__name__}: {error}', 200)}); expected augmentation settings that work on "
                "every image: a program or settings error, not damaged data"
            ) from error
        streak = 0
        yield image, label, key
    if max_streak and seen and streak == seen:
        raise ImagenetTrainError(_nothing_decodes(url, f"none of the {seen} samples read is usable", damage))


def _nothing_decodes(url: str | None, what: str, error: Exception | None) -> str:
    """The line that stops a worker whose data does not decode."""
    return (
        f"{clip(url, 200)}: {what} (the last: {clip(str(error), 120)}); expected JPEG images with a class each: "
        "is this the right data and --decoder? (--max-corrupt-streak sets when this stops the run)"
    )
