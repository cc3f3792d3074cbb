"""A node-local shard cache: the first read of a remote shard also writes it to local disk, later
epochs read the local copy. Complete copies only: a copy appears under its final name after the
whole shard was read.

With a sha256 from the index (`open_verified`), no byte of a shard is used before it matched: the shard is
fetched whole into the cache and checked before it is renamed into place, and a cached copy is hashed
again before each use (a damaged or planted copy is fetched anew). Without one, the copy is made while
the loader reads (`open_cached`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
from collections.abc import Callable
from typing import BinaryIO

from imagenet_train.io.integrity import DigestMismatch, copy_verified


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
    os.makedirs(cache_dir, exist_ok=True)
    path = cache_path(cache_dir, url)
    if os.path.exists(path):
        return open(path, "rb", buffering=1 << 20)
    return io.BufferedReader(_Tee(open_remote(url), path), buffer_size=1 << 20)


def _temporary(path: str) -> tuple[int, str]:
    """A new file next to `path` that nobody else could have made or linked beforehand (O_EXCL)."""
    return tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.", suffix=".part")


def open_verified(
    url: str, cache_dir: str, open_remote: Callable[[str], BinaryIO], sha256: str, size: int | None
) -> BinaryIO:
    """The local copy of `url`, checked against the index's `sha256` (and `size`) before anything is read
    from it; raises DigestMismatch when the remote shard does not match (nothing is cached then)."""
    os.makedirs(cache_dir, exist_ok=True)
    path = cache_path(cache_dir, url)
    if os.path.exists(path):
        local = open(path, "rb", buffering=1 << 20)  # noqa: SIM115 (returned, or closed below)
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
