"""Atomic file replacement: write beside the destination under a fresh unpredictable name, fsync, rename.

The temporary name is made with O_CREAT|O_EXCL|O_NOFOLLOW (tempfile.mkstemp), so nothing another user planted in
a shared folder is opened, followed or overwritten, and the rename replaces a link at the destination's name rather
than writing through it. A failed write removes its temporary file and leaves the previous file as it was.
Temporary names are `.NAME.XXXXXXXX.tmp`: the results mirror and `sync` skip them.

A private write (`private=True`: the run directory's records, checkpoints, upload sessions) makes the file 0600
and first checks that the destination's folder is this user's and closed to others' writes (io/owned.py).
Appends (`appending`) open the file itself without following a link.

`own_folder` and `replace_in` do the same inside a folder held open by descriptor (O_NOFOLLOW), for a folder
inside a directory that may come from elsewhere (`report`'s RUN_DIR/report): a link in the folder's place is
refused, a link in a file's place is replaced by the new file, never written through.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from typing import IO

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.owned import ours, owned_folder, refusal


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
def replacing(path: str | os.PathLike, private: bool = False) -> Iterator[str]:
    """A new empty temporary file beside `path`, renamed onto `path` (after fsync) when the block ends.

    For writers that want a file name (a download). An exception in the block removes the temporary file.
    `private`: the file is 0600, in a folder that must be this user's and closed to others' writes.
    """
    path = os.fspath(path)
    folder, name = os.path.split(path)
    if private:
        owned_folder(folder or ".")
    handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
    try:
        # else what open() would have made: mkstemp's 0600 would hide shards from the server that serves them
        os.fchmod(handle, 0o600 if private else 0o666 & ~_umask())
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
def atomic_write(path: str | os.PathLike, mode: str = "wb", buffering: int = -1, private: bool = False) -> Iterator[IO]:
    """An open file whose content replaces `path` in one step when the block ends without an error
    (`private`: see `replacing`)."""
    with replacing(path, private) as temporary:
        handle = os.open(temporary, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(handle, mode, buffering=buffering) as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())


_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def appending(path: str | os.PathLike, mode: int = 0o600) -> IO[str]:
    """`path` opened to append text (made with `mode` when absent) without following a link at its name; a link,
    or anything but a regular file (a FIFO), is one error line naming the file."""
    try:
        # O_NONBLOCK: a planted FIFO fails at once (ENXIO) instead of blocking the open.
        handle = os.open(path, _APPEND, mode)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ImagenetTrainError(
                f"{path}: a symbolic link where this run appends its own file (planted by another user?); refused"
            ) from None
        if error.errno != errno.ENXIO:
            raise write_failed(path, error, "cannot append") from None
        handle = -1
    if handle < 0 or not stat.S_ISREG(os.fstat(handle).st_mode):
        if handle >= 0:
            os.close(handle)
        raise ImagenetTrainError(f"{path}: not a regular file where this run appends its own file; refused")
    return os.fdopen(handle, "a", encoding="ascii")


def own_folder(path: str | os.PathLike, what: str) -> int:
    """A descriptor of the folder `path` (made if absent): a directory of this user that no one else may write to,
    opened without following a link; anything else is one error line naming `what` and the path.

    Not io/owned.py's `owned_folder`, which checks a path and follows a link this user made: this one is for a folder
    inside a directory that may come from elsewhere, so it refuses any link in the folder's place and hands back the
    descriptor it checked, for `replace_in` to write through. Both judge the folder by `ours` and refuse alike."""
    path = os.fspath(path)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)  # mkdir never follows a link at `path`: FileExistsError, then refused below
        handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        found = "a link, not followed" if os.path.islink(path) else (error.strerror or type(error).__name__)
        raise ImagenetTrainError(f"{what} {path}: {found}; expected a directory of this user, refused") from None
    info = os.fstat(handle)
    if stat.S_ISDIR(info.st_mode) and ours(info):
        return handle
    os.close(handle)
    raise refusal(f"{what} {path}", info, "another user could put links in it")


def replace_in(folder: int, name: str, data: bytes) -> None:
    """`data` as the file `name` in the folder open as `folder`: a new file renamed over the name, so whatever was
    there (a link included) is replaced, never written through."""
    temporary = f".{name}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    handle = os.open(temporary, flags, 0o666, dir_fd=folder)  # the umask applies, as for open()
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=folder)
        raise
