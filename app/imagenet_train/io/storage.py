"""Opening URLs and paths through the table of schemes (io/schemes.py: local paths, file://, http(s)://, gs://,
s3://, ais://, pipe:), small ones read whole, and the environment the schemes' loader workers need."""

from __future__ import annotations

import io
import os
from typing import BinaryIO

from imagenet_train.errors import ImagenetTrainError, clip
from imagenet_train.io import schemes
from imagenet_train.io.locations import is_url, join, local_path, outside_reason, parent
from imagenet_train.limits import IO_TIMEOUT

# What the callers (datasets/, loading/, the tests) have always imported from here: where a URL's relatives are.
__all__ = ["is_url", "join", "local_path", "outside_reason", "parent"]

# What the loader's workers copy of the environment (launchers/ssh.py forwards it too): every scheme's variables,
# from its entry in io/schemes.py.
IO_ENVIRONMENT = schemes.worker_environment()


def io_environment() -> dict[str, str]:
    """The variables that decide where and how URLs are reached (credentials, endpoints, proxies)."""
    chosen = schemes.worker_environment()
    return {k: v for k, v in os.environ.items() if k.startswith(chosen)}


def apply_io_environment(snapshot: dict[str, str]) -> None:
    """Make this process's I/O environment the snapshot's.

    DataLoader workers come from a forkserver whose environment is the one it started with; a
    variable set later in the training process (an endpoint, a key file) would otherwise never
    reach them.
    """
    chosen = schemes.worker_environment()
    for key in [k for k in os.environ if k.startswith(chosen) and k not in snapshot]:
        del os.environ[key]
    os.environ.update(snapshot)


def open_stream(location: str, io_timeout: float = IO_TIMEOUT) -> BinaryIO:
    """Open a URL or path for sequential binary reading through its scheme's entry in io/schemes.py; remote reads
    wait out outages for `io_timeout` s. A scheme the table lacks is one line."""
    return schemes.scheme_for(location).opens(location, io_timeout)


def stream_size(stream: object) -> int | None:
    """The size of the object behind an opened stream, where it is known."""
    size = getattr(getattr(stream, "raw", stream), "size", None)
    fileno = getattr(stream, "fileno", None)
    if size is None and fileno is not None:
        try:
            return os.fstat(fileno()).st_size
        except (OSError, io.UnsupportedOperation):
            return None
    return size


def read_bytes(location: str, io_timeout: float = IO_TIMEOUT, limit: int = 64 << 20) -> bytes:
    """Read a whole small resource, such as a shard index; more than `limit` bytes is an error, found
    without reading past the limit."""
    chunks: list[bytes] = []
    total = 0
    with open_stream(location, io_timeout=io_timeout) as stream:
        while total <= limit:
            chunk = stream.read(min(1 << 20, limit + 1 - total))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
    raise ImagenetTrainError(f"{clip(location)}: more than {limit} bytes; expected a small metadata file")
