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
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import tempfile
from collections.abc import Callable
from typing import BinaryIO

from imagenet_train.io.integrity import DigestMismatch, copy_verified
from imagenet_train.io.owned import ours, private_folder


def checked_cache_dir(cache_dir: str) -> str:
    """The folder to cache in: `cache_dir` when it is this user's and closed to others' writes; a private
    folder of this user inside it when root owns it (a pod's emptyDir, /tmp); else an error naming it."""
    return private_folder(cache_dir, "--cache-dir", "another user could plant shards in it")


def _open_own(path: str) -> BinaryIO | None:
    """The cached copy at `path` when it is this user's regular file closed to others' writes, else None."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # absent, or a link: fetched anew (os.replace puts the copy in its place)
        return None
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode) or not ours(info):
        os.close(handle)
        return None
    return open(handle, "rb", buffering=1 << 20)


def cache_path(cache_dir: str, url: str) -> str:
    """Where the cached copy of the shard at `url` lives in `cache_dir`."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return os.path.join(cache_dir, f"{digest}-{os.path.basename(url.split('?')[0]) or 'shard'}")


class _Tee(io.RawIOBase):
    """Reads from `source` and writes the same bytes to a temporary file, renamed into place at EOF."""

    def __init__(self, source: BinaryIO, path: str):
        self.source, self.path = source, path
        descriptor, self.temporary = _temporary(path)
        self.sink = os.fdopen(descriptor, "wb")  # noqa: SIM115 (closed in close())
        self.complete = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.source.read(len(buffer))
        if not data:
            self.complete = True
            return 0
        buffer[: len(data)] = data
        self.sink.write(data)
        return len(data)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if not self.complete:  # tar readers stop at the end marker: keep the padding too
                while block := self.source.read(1 << 20):
                    self.sink.write(block)
                self.complete = True
        except Exception:
            self.complete = False
        self.sink.close()
        self.source.close()
        if self.complete:
            os.replace(self.temporary, self.path)
        else:
            os.unlink(self.temporary)
        super().close()


def open_cached(url: str, cache_dir: str, open_remote: Callable[[str], BinaryIO]) -> BinaryIO:
    """The local copy of `url` if cached, else the remote stream, copied to the cache as it is read."""
    path = cache_path(checked_cache_dir(cache_dir), url)
    local = _open_own(path)
    if local is not None:
        return local
    return io.BufferedReader(_Tee(open_remote(url), path), buffer_size=1 << 20)


def _temporary(path: str) -> tuple[int, str]:
    """A new file next to `path` that nobody else could have made or linked beforehand (O_EXCL)."""
    return tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.", suffix=".part")


def open_verified(
    url: str, cache_dir: str, open_remote: Callable[[str], BinaryIO], sha256: str, size: int | None
) -> BinaryIO:
    """The local copy of `url`, checked against the index's `sha256` (and `size`) before anything is read
    from it; raises DigestMismatch when the remote shard does not match (nothing is cached then)."""
    path = cache_path(checked_cache_dir(cache_dir), url)
    local = _open_own(path)
    if local is not None:
        try:
            copy_verified(local, None, sha256, size)
        except DigestMismatch:
            local.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
        else:
            local.seek(0)
            return local
    descriptor, temporary = _temporary(path)
    try:
        with os.fdopen(descriptor, "wb") as sink, open_remote(url) as remote:
            copy_verified(remote, sink, sha256, size)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return open(path, "rb", buffering=1 << 20)
