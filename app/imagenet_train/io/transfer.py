"""`imagenet-train upload` and `sync`: directory ↔ gs:// prefix, in parallel, skipping what is already
there with the same checksum, verifying every copy."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import gcs


@dataclass(frozen=True)
class Copy:
    source: str
    target: str
    size: int
    action: str  # "copy" or "skip"


def plan_upload(directory: str, url: str, io_timeout: float = 900.0) -> list[Copy]:
    """What `upload` would do: every file under `directory`, skipped where the bucket has its CRC32C."""
    if not os.path.isdir(directory):
        raise ImagenetTrainError(f"{directory}: not a directory")
    base = url.rstrip("/")
    remote = {info.name: info for info in gcs.listing(base + "/", io_timeout)}
    _, prefix = gcs.split(base + "/")
    copies = []
    for root, _, files in sorted(os.walk(directory)):
        for name in sorted(files):
            path = os.path.join(root, name)
            relative = os.path.relpath(path, directory).replace(os.sep, "/")
            if ".tmp" in name or ".part" in name:  # our own in-progress files
                continue
            there = remote.get(prefix + relative)
            same = there is not None and there.size == os.path.getsize(path) and there.crc32c == gcs.file_crc32c(path)
            copies.append(Copy(path, f"{base}/{relative}", os.path.getsize(path), "skip" if same else "copy"))
    return copies


def plan_sync(url: str, directory: str, io_timeout: float = 900.0) -> list[Copy]:
    """What `sync` would do: every object under the prefix, skipped where the local file matches."""
    base = url.rstrip("/")
    _, prefix = gcs.split(base + "/")
    objects = gcs.listing(base + "/", io_timeout)
    if not objects:
        raise ImagenetTrainError(f"{url}: no objects under this prefix")
    copies = []
    for info in objects:
        relative = info.name[len(prefix) :]
        path = os.path.join(directory, *relative.split("/"))
        same = os.path.isfile(path) and os.path.getsize(path) == info.size and gcs.file_crc32c(path) == info.crc32c
        copies.append(Copy(f"gs://{gcs.split(base)[0]}/{info.name}", path, info.size, "skip" if same else "copy"))
    return copies


def run(
    copies: list[Copy], copy: Callable[[str, str, float], object], workers: int = 8, io_timeout: float = 900.0
) -> int:
    """Carry out the copies in parallel; returns how many were copied."""
    todo = [c for c in copies if c.action == "copy"]
    # Shard indexes go last: whoever polls for the index (the chart's init containers) must never see
    # one whose shards are still on their way.
    indexes = [c for c in todo if c.target.endswith(".json")]
    rest = [c for c in todo if not c.target.endswith(".json")]

    def one(item: Copy) -> None:
        if copy is gcs.download:
            os.makedirs(os.path.dirname(item.target) or ".", exist_ok=True)
        copy(item.source, item.target, io_timeout)

    with ThreadPoolExecutor(max(1, workers)) as pool:
        list(pool.map(one, rest))
        list(pool.map(one, indexes))
    return len(todo)


def upload_tree(directory: str, url: str, workers: int = 8, io_timeout: float = 900.0) -> int:
    return run(plan_upload(directory, url, io_timeout), gcs.upload, workers, io_timeout)


def sync_tree(url: str, directory: str, workers: int = 8, io_timeout: float = 900.0) -> int:
    return run(plan_sync(url, directory, io_timeout), gcs.download, workers, io_timeout)
