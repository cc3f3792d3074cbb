"""Atomic file replacement: write beside the destination under a fresh unpredictable name, fsync, rename.

The temporary name is made with O_CREAT|O_EXCL (tempfile.mkstemp), so nothing another user planted in a
shared folder is opened, followed or overwritten. A failed write removes its temporary file and leaves the
previous file as it was. Temporary names are `.NAME.XXXXXXXX.tmp`: the results mirror and `sync` skip them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO

from imagenet_train.errors import ImagenetTrainError


def free_space(folder: str | os.PathLike) -> str:
    """'N MB free on DIR' for the nearest existing folder."""
    folder = os.path.abspath(folder)
    while not os.path.exists(folder) and folder != os.path.dirname(folder):
        folder = os.path.dirname(folder)
    try:
        return f"{shutil.disk_usage(folder).free / 1e6:.1f} MB free on {folder}"
    except OSError:
        return f"free space on {folder} unknown"


def write_failed(path: str | os.PathLike, error: OSError, what: str = "cannot write") -> ImagenetTrainError:
    """The one line for a local write that failed: the path, the reason and the free space beside it."""
    reason = error.strerror or type(error).__name__
    return ImagenetTrainError(f"{path}: {what} ({reason}; {free_space(os.path.dirname(os.fspath(path)) or '.')})")


def _umask() -> int:
    """This process's umask, read without changing it (Linux), else by setting and restoring it."""
    with contextlib.suppress(OSError, ValueError, StopIteration), open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    current = os.umask(0o022)
    os.umask(current)
    return current


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[str]:
    """A new empty temporary file beside `path`, renamed onto `path` (after fsync) when the block ends.

    For writers that want a file name (a download). An exception in the block removes the temporary file.
    """
    path = os.fspath(path)
    folder, name = os.path.split(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
    try:
        os.fchmod(handle, 0o666 & ~_umask())  # what open() would have made; mkstemp's 0600 would hide shards
        os.close(handle)
        yield temporary
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", buffering: int = -1) -> Iterator[IO]:
    """An open file whose content replaces `path` in one step when the block ends without an error."""
    with replacing(path) as temporary, open(temporary, mode, buffering=buffering) as stream:
        yield stream
        stream.flush()
        os.fsync(stream.fileno())
