"""Bucket object names as local paths: one check, so that no name written by whoever controls a bucket can
lead a download outside its destination (the rule of tarfile's `data` filter, applied to object names)."""

from __future__ import annotations

import os
import unicodedata

NAME_MAX = 255  # bytes in one path segment on Linux file systems


class UnsafeName(ValueError):
    """An object name that cannot be a path under the destination; the message says why."""


def relative_parts(name: str) -> tuple[str, ...]:
    """The path segments of an object's name relative to the synced prefix; UnsafeName if it is not plain."""
    if not name:
        raise UnsafeName("empty name")
    if any(unicodedata.category(c) == "Cc" for c in name):
        raise UnsafeName("control character")
    if "\\" in name:
        raise UnsafeName("backslash")
    if name.startswith("/"):
        raise UnsafeName("absolute name")
    parts = tuple(name.split("/"))
    for part in parts:
        if part in ("", ".", ".."):
            raise UnsafeName("empty segment" if not part else f"'{part}' segment")
        if len(part.encode()) > NAME_MAX:
            raise UnsafeName(f"segment longer than {NAME_MAX} bytes")
    return parts


def confined(directory: str, path: str) -> str:
    """`path` unchanged if, with every existing symlink resolved, it stays under `directory`; else UnsafeName."""
    root = os.path.realpath(directory)
    # realpath follows the symlinks that exist (in the parents and at the name itself) and keeps the rest
    real = os.path.realpath(path)
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise UnsafeName("a symlink in the destination leads outside it")
    return path


def local_path(directory: str, name: str) -> str:
    """Where the object `name` (relative to the synced prefix) goes under `directory`; UnsafeName if nowhere."""
    return confined(directory, os.path.join(directory, *relative_parts(name)))


def shown(name: str, limit: int = 80) -> str:
    """A name for an error line: quoted, control characters escaped, clipped to about `limit` characters."""
    return repr(name if len(name) <= limit else name[: limit - 3] + "...")
