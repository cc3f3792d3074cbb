"""A node-local shard cache: the first read of a remote shard also writes it to local disk, later
epochs read the local copy. Complete copies only: a copy appears under its final name after the
whole shard was read.

With a sha256 from the index (`open_verified`), no byte of a shard is used before it matched: the shard is
fetched whole into the cache and checked before it is renamed into place, and a cached copy is hashed
again before each use (a damaged or planted copy is fetched anew). Without one, the copy is made while
the loader reads (`open_cached`).

The cache names are predictable (a hash of the URL), so another local user who made the folder, or may write
to it, could plant samples there that training reads instead of the server's. A cache folder is used when it
is a real directory of this user that no one else may write to. A folder root owns and others may write to
(a pod's emptyDir is 0777, /tmp is 1777) gets a private folder of this user inside it, made 0700. Any other
folder (another user's) is one error line: a fallback elsewhere would fill a disk the operator did not name.
A cached file is used only when it is a regular file of this user that no one else may write to, else it
is fetched anew.

With `--cache-max-bytes` the folder stays at or under that size (io/cache_space.py): a copy's space is reserved
before it is written, least recently used idle copies are evicted to make it, and a copy being read is never
removed (readers hold a shared lock on it). A shard that cannot be cached (size unknown, larger than the limit,
every copy in use) is read straight from its URL, checked at its end as without a cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import stat
from collections.abc import Callable
from typing import BinaryIO

from imagenet_train.io.cache_space import decision, reserve
from imagenet_train.io.integrity import DigestMismatch, copy_verified
from imagenet_train.io.owned import ours, private_folder


def checked_cache_dir(cache_dir: str) -> str:
    """The folder to cache in: `cache_dir` when it is this user's and closed to others' writes; a private
    folder of this user inside it when root owns it (a pod's emptyDir, /tmp); else an error naming it."""
    return private_folder(cache_dir, "--cache-dir", "another user could plant shards in it")


class CheckedCopy(io.BufferedReader):
    """A cached copy already checked against the index's sha256: the loader need not hash it again."""


def _open_own(path: str, kind: type[io.BufferedReader] = io.BufferedReader) -> BinaryIO | None:
    """The cached copy at `path` when it is this user's regular file closed to others' writes, else None; held
    with a shared lock (the evictor leaves it be) and marked as used now (least recently used goes first)."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # absent, or a link: fetched anew (os.replace puts the copy in its place)
        return None
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode) or not ours(info):
        os.close(handle)
        return None
    fcntl.flock(handle, fcntl.LOCK_SH)
    if os.fstat(handle).st_nlink == 0:  # evicted between open and lock: its space no longer counts, refetch
        os.close(handle)
        return None
    os.utime(handle)
    return kind(io.FileIO(handle, "rb"), buffer_size=1 << 20)


def cache_path(cache_dir: str, url: str) -> str:
    """Where the cached copy of the shard at `url` lives in `cache_dir`."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return os.path.join(cache_dir, f"{digest}-{os.path.basename(url.split('?')[0]) or 'shard'}")


class _Tee(io.RawIOBase):
    """Reads from `source` and writes the same bytes to a temporary file, renamed into place at EOF."""

    def __init__(self, source: BinaryIO, path: str, part: tuple[int, str], reserved: int | None):
        self.source, self.path, self.reserved = source, path, reserved
        descriptor, self.temporary = part
        self.sink = os.fdopen(descriptor, "wb")  # noqa: SIM115 (closed in close())
        self.complete, self.written, self.overrun = False, 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.source.read(len(buffer))
        if not data:
            self.complete = True
            return 0
        buffer[: len(data)] = data
        self._keep(data)
        return len(data)

    def _keep(self, data: bytes) -> None:
        """Write `data` to the copy; a stream longer than the space reserved for it is not cached."""
        self.written += len(data)
        self.overrun = self.overrun or (self.reserved is not None and self.written > self.reserved)
        if not self.overrun:
            self.sink.write(data)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self.complete:  # tar readers stop at the end marker: keep the padding too
                while block := self.source.read(1 << 20):
                    self._keep(block)
                self.complete = True
            self.sink.flush()
            if not self.overrun:  # the reservation was the size the stream reported; the copy is what came
                os.ftruncate(self.sink.fileno(), self.written)
        except Exception:
            self.complete = False
        # Renamed or removed while this writer still locks it: no evictor takes it for a killed writer's.
        bounded = self.reserved is not None
        with decision(os.path.dirname(self.path)) if bounded else contextlib.nullcontext():
            if not (self.complete and not self.overrun and _in_place(self.temporary, self.path, bounded)):
                with contextlib.suppress(OSError):
                    os.unlink(self.temporary)
        self.sink.close()
        self.source.close()
        super().close()


def _file_size(stream: BinaryIO) -> int | None:
    """The size of a stream that is a local file; None for others (the loader passes storage.stream_size)."""
    try:
        return os.fstat(stream.fileno()).st_size
    except (OSError, AttributeError, io.UnsupportedOperation):
        return None


def open_cached(
    url: str,
    cache_dir: str,
    open_remote: Callable[[str], BinaryIO],
    max_bytes: int = 0,
    size_of: Callable[[BinaryIO], int | None] = _file_size,
) -> BinaryIO:
    """The local copy of `url` if cached, else the remote stream, copied to the cache as it is read when its
    size (`size_of` the stream) fits under `max_bytes` (0: no limit)."""
    path = cache_path(checked_cache_dir(cache_dir), url)
    local = _open_own(path)
    if local is not None:
        return local
    remote = open_remote(url)
    size = size_of(remote)
    try:
        part = reserve(path, size, max_bytes, ours)
    except BaseException:
        remote.close()
        raise
    if part is None:
        return remote
    return io.BufferedReader(_Tee(remote, path, part, size if max_bytes else None), buffer_size=1 << 20)


def _checked_local(path: str, sha256: str, size: int | None) -> BinaryIO | None:
    """The cached copy at `path` once it matched the index's sha256; a damaged or planted one is removed."""
    local = _open_own(path, CheckedCopy)
    if local is None:
        return None
    try:
        copy_verified(local, None, sha256, size)
    except DigestMismatch:
        local.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    local.seek(0)
    return local


def _in_place(temporary: str, path: str, bounded: bool) -> bool:
    """Rename a finished copy to `path`, unless (under a limit) a copy is there already: a reader may hold that
    one, and its blocks would outlive its name uncounted; the new copy is removed then. Whether it was renamed."""
    if bounded:
        with contextlib.suppress(FileNotFoundError):
            if ours(info := os.lstat(path)) and stat.S_ISREG(info.st_mode):
                os.unlink(temporary)
                return False
    os.replace(temporary, path)
    return True


def open_verified(
    url: str,
    cache_dir: str,
    open_remote: Callable[[str], BinaryIO],
    sha256: str,
    size: int | None,
    max_bytes: int = 0,
) -> BinaryIO:
    """The local copy of `url`, checked against the index's `sha256` (and `size`) before anything is read
    from it; raises DigestMismatch when the remote shard does not match (nothing is cached then). When it
    cannot be cached under `max_bytes`, the remote stream (not a CheckedCopy: the loader checks it at its end)."""
    path = cache_path(checked_cache_dir(cache_dir), url)
    local = _checked_local(path, sha256, size)
    if local is not None:
        return local
    part = reserve(path, size, max_bytes, ours)
    if part is None:
        return open_remote(url)
    descriptor, temporary = part
    try:
        with os.fdopen(descriptor, "wb", closefd=False) as sink, open_remote(url) as remote:
            copy_verified(remote, sink, sha256, size)
        # Renamed and held for reading before any evictor looks (no lock file without a limit, as before).
        with decision(os.path.dirname(path)) if max_bytes else contextlib.nullcontext():
            placed = _in_place(temporary, path, bool(max_bytes))
            fcntl.flock(descriptor, fcntl.LOCK_SH)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        os.close(descriptor)
        raise
    if not placed:  # another process cached it meanwhile: read that one (checked again), else from the URL
        os.close(descriptor)
        return _checked_local(path, sha256, size) or open_remote(url)
    os.lseek(descriptor, 0, os.SEEK_SET)
    return CheckedCopy(io.FileIO(descriptor, "rb"), buffer_size=1 << 20)
