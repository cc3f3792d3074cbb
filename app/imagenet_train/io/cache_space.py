"""The node-local cache's size under `--cache-max-bytes`: what to evict (pure arithmetic, `victims`) and the
file locks through which every rank and DataLoader worker sharing one node's cache agrees (`reserve`).

Locks, all `fcntl.flock` (per open file, so two opens in one process exclude each other too):
- a reader holds a shared lock on the cached copy it reads; a writer an exclusive one on its `.part` file;
- the evictor removes only files it locks exclusively without waiting, so a file in use is never removed,
  and a `.part` nobody holds is a killed writer's, removed whatever the space;
- every reserve-and-evict decision is taken under one lock file in the cache folder, and a `.part` is made,
  locked and grown to the size it reserves inside that decision, so the space counts before it is written.
Sizes are apparent sizes (`st_size`): a reservation is a sparse file the copy then fills.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

LOCK_NAME = ".cache.lock"
PART_SUFFIX = ".part"
_warned: set[str] = set()


@dataclass(frozen=True)
class Entry:
    """A file in the cache folder: its name, apparent size, last use (mtime), and whether someone holds it."""

    name: str
    size: int
    mtime: float
    busy: bool = False

    @property
    def stale(self) -> bool:
        """A partial copy nobody writes any more (its writer was killed)."""
        return self.name.endswith(PART_SUFFIX) and not self.busy


def victims(entries: Sequence[Entry], limit: int, need: int) -> list[Entry] | None:
    """The files to remove so that `need` more bytes fit under `limit`: stale partial copies, then idle files
    least recently used first; None when no choice of idle files makes room (or `need` alone exceeds it)."""
    if need > limit:
        return None
    chosen = [entry for entry in entries if entry.stale]
    excess = sum(entry.size for entry in entries) - sum(entry.size for entry in chosen) + need - limit
    idle = sorted((e for e in entries if not e.busy and not e.stale), key=lambda e: (e.mtime, e.name))
    for entry in idle:
        if excess <= 0:
            break
        chosen.append(entry)
        excess -= entry.size
    return chosen if excess <= 0 else None


def warn_once(reason: str, message: str, *args: object) -> None:
    """One warning per reason per process: a cache that cannot hold a shard is said once, not per shard."""
    if reason not in _warned:
        _warned.add(reason)
        log.warning(message, *args)


@contextlib.contextmanager
def decision(folder: str) -> Iterator[None]:
    """Hold the cache folder's lock file: one reserve-and-evict decision at a time on this node."""
    descriptor = os.open(os.path.join(folder, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _survey(folder: str, ours: Callable[[os.stat_result], bool]) -> tuple[list[Entry], dict[str, int]]:
    """Every regular file in `folder` as an Entry, and descriptors holding an exclusive lock on the idle ones."""
    entries: list[Entry] = []
    held: dict[str, int] = {}
    for item in os.scandir(folder):
        if item.name == LOCK_NAME:
            continue
        try:
            descriptor = os.open(item.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # gone since listed, or a link: not ours to count
            continue
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            os.close(descriptor)
            continue
        busy = not ours(info)  # counted, never removed
        if not busy:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                busy = True
        if busy:
            os.close(descriptor)
        else:
            held[item.name] = descriptor
        entries.append(Entry(item.name, info.st_size, info.st_mtime, busy))
    return entries, held


def new_part(path: str) -> tuple[int, str]:
    """A new `.part` file next to `path`, locked by this writer, that nobody else could have made beforehand."""
    descriptor, temporary = tempfile.mkstemp(
        dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.", suffix=PART_SUFFIX
    )
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    return descriptor, temporary


def reserve(path: str, size: int | None, limit: int, ours: Callable[[os.stat_result], bool]) -> tuple[int, str] | None:
    """A locked `.part` for a copy of `size` bytes at `path`, the space made under `limit` (0: no limit) by
    evicting least recently used idle files; None (said once) when the copy cannot be cached."""
    if not limit:
        return new_part(path)
    if size is None:
        warn_once("unknown", "--cache-max-bytes: a shard of unknown size is read without caching (%s)", path)
        return None
    if size > limit:
        warn_once("large", "--cache-max-bytes %d: a shard of %d bytes is read without caching", limit, size)
        return None
    folder = os.path.dirname(path)
    with decision(folder):
        entries, held = _survey(folder, ours)
        try:
            chosen = victims(entries, limit, size)
            if chosen is None:
                warn_once("busy", "--cache-max-bytes %d: every cached shard is in use; reading without caching", limit)
                return None
            for entry in chosen:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, entry.name))
            descriptor, temporary = new_part(path)
            os.ftruncate(descriptor, size)
            return descriptor, temporary
        finally:
            for descriptor in held.values():
                os.close(descriptor)
