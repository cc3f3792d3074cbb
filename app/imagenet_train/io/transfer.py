"""`imagenet-train upload` and `sync`: directory ↔ bucket prefix (of a scheme with a writer in io/schemes.py), in
parallel, skipping what is already there with the same checksum, verifying every copy.

A bucket's object names are input from whoever can write to it: `sync` (and `fill`, and fetching a run back
for --resume) refuses the whole prefix, before copying anything, when any name is not a plain path under the
destination (io/paths.py says which are).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import schemes
from imagenet_train.io.paths import UnsafeName, confined, local_path, shown
from imagenet_train.limits import IO_TIMEOUT


@dataclass(frozen=True)
class Copy:
    source: str
    target: str
    size: int
    action: str  # "copy", "skip", or "refuse": the object's name cannot be a path under `destination`
    destination: str = ""  # downloads: the directory `target` must stay under
    name: str = ""  # downloads: the object's name relative to the synced prefix
    reason: str = ""  # why a name was refused


def plan_upload(directory: str, url: str, io_timeout: float = IO_TIMEOUT) -> list[Copy]:
    """What `upload` would do: every file under `directory`, skipped where the bucket has its CRC32C."""
    if not os.path.isdir(directory):
        raise ImagenetTrainError(f"{directory}: not a directory")
    store = schemes.writer_for(url)
    base = url.rstrip("/")
    remote = {info.name: info for info in store.listing(base + "/", io_timeout)}
    _, prefix = store.split(base + "/")
    copies = []
    for root, _, files in sorted(os.walk(directory)):
        for name in sorted(files):
            path = os.path.join(root, name)
            relative = os.path.relpath(path, directory).replace(os.sep, "/")
            if ".tmp" in name or ".part" in name:  # our own in-progress files
                continue
            there = remote.get(prefix + relative)
            same = there is not None and there.size == os.path.getsize(path) and there.crc32c == store.file_crc32c(path)
            copies.append(Copy(path, f"{base}/{relative}", os.path.getsize(path), "skip" if same else "copy"))
    return copies


def plan_sync(url: str, directory: str, io_timeout: float = IO_TIMEOUT) -> list[Copy]:
    """What `sync` would do: every object under the prefix, skipped where the local file matches, refused
    where its name is not a plain path under `directory` (see `check_names`)."""
    store = schemes.writer_for(url)
    base = url.rstrip("/")
    bucket, prefix = store.split(base + "/")
    objects = store.listing(base + "/", io_timeout)
    if not objects:
        raise ImagenetTrainError(f"{url}: no objects under this prefix")
    copies = []
    for info in objects:
        relative = info.name[len(prefix) :]
        folder = info.size == 0 and relative.endswith("/")  # a console "folder": no data, its name is checked
        relative = relative[:-1] if folder else relative
        if folder and not relative:
            continue
        source = f"{schemes.name_of(url)}://{bucket}/{info.name}"
        try:
            path = local_path(directory, relative)
        except UnsafeName as why:
            copies.append(Copy(source, "", info.size, "refuse", directory, relative, str(why)))
            continue
        if folder:
            continue
        same = os.path.isfile(path) and os.path.getsize(path) == info.size and store.file_crc32c(path) == info.crc32c
        copies.append(Copy(source, path, info.size, "skip" if same else "copy", directory, relative))
    return copies


def check_names(url: str, copies: list[Copy]) -> None:
    """One error line for a plan with refused object names: how many, and the first with its reason."""
    refused = [c for c in copies if c.action == "refuse"]
    if refused:
        first = refused[0]
        raise ImagenetTrainError(
            f"{url}: {len(refused)} object name(s) are not plain paths under {first.destination} "
            f"(first: {shown(first.name)}, {first.reason}); nothing was copied"
        )


def run(
    copies: list[Copy],
    copy: Callable[[str, str, float], object],
    workers: int = 8,
    io_timeout: float = IO_TIMEOUT,
    folder_mode: int = 0o777,
) -> int:
    """Carry out the copies in parallel; returns how many were copied. A plan with refused names copies nothing.
    Folders a download needs are made with `folder_mode` (less the umask)."""
    refused = next((c for c in copies if c.action == "refuse"), None)
    if refused:
        raise ImagenetTrainError(f"{shown(refused.source)}: {refused.reason}; nothing was copied")
    todo = [c for c in copies if c.action == "copy"]
    # Shard indexes go last: whoever polls for the index (the chart's init containers) must never see
    # one whose shards are still on their way.
    indexes = [c for c in todo if c.target.endswith(".json")]
    rest = [c for c in todo if not c.target.endswith(".json")]

    def one(item: Copy) -> None:
        if item.destination:
            try:  # again, now: a symlink may have appeared in the destination since the plan was made
                confined(item.destination, item.target)
            except UnsafeName as why:
                raise ImagenetTrainError(f"{item.source}: {why} ({item.target})") from None
            os.makedirs(os.path.dirname(item.target) or ".", mode=folder_mode, exist_ok=True)
        copy(item.source, item.target, io_timeout)

    with ThreadPoolExecutor(max(1, workers)) as pool:
        list(pool.map(one, rest))
        list(pool.map(one, indexes))
    return len(todo)


def upload_tree(directory: str, url: str, workers: int = 8, io_timeout: float = IO_TIMEOUT) -> int:
    """Upload `directory` to `url` (see `plan_upload`); returns how many files were copied."""
    return run(plan_upload(directory, url, io_timeout), schemes.writer_for(url).upload, workers, io_timeout)


def sync_tree(url: str, directory: str, workers: int = 8, io_timeout: float = IO_TIMEOUT, private: bool = False) -> int:
    """Download `url` into `directory` (see `plan_sync`); returns how many files were copied. `private` (a run
    directory): files 0600 and new folders 0700, each written into a folder of this user closed to others."""
    copies = plan_sync(url, directory, io_timeout)
    check_names(url, copies)
    store = schemes.writer_for(url)
    if private:
        return run(copies, functools.partial(store.download, private=True), workers, io_timeout, 0o700)
    return run(copies, store.download, workers, io_timeout)
