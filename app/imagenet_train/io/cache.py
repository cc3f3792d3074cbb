"""A node-local shard cache: the first read of a remote shard also writes it to local disk, later
epochs read the local copy. Complete copies only: a copy appears under its final name after the
whole shard was read."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
from typing import BinaryIO


def cache_path(cache_dir: str, url: str) -> str:
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return os.path.join(cache_dir, f"{digest}-{os.path.basename(url.split('?')[0]) or 'shard'}")


class _Tee(io.RawIOBase):
    """Reads from `source` and writes the same bytes to a temporary file, renamed into place at EOF."""

    def __init__(self, source: BinaryIO, path: str):
        self.source, self.path = source, path
        self.temporary = f"{path}.part{os.getpid()}"
        self.sink = open(self.temporary, "wb")  # noqa: SIM115 (closed in close())
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
