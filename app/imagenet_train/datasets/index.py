"""The shard index `shards.json`: WebDataset's wids-shard-index-v1 plus classes, splits and checksums."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import storage
from imagenet_train.io.atomic import atomic_write

INDEX_NAME = "shards.json"
INDEX_KIND = "wids-shard-index-v1"


@dataclass
class ShardIndex:
    """A loaded index; shard URLs in it are resolved relative to where it was read from."""

    location: str
    data: dict = field(repr=False)

    @property
    def classes(self) -> list[str]:
        return list(self.data.get("classes", []))

    def splits(self) -> list[str]:
        return list(self.data.get("splits", {}))

    def shards(self, split: str) -> list[dict]:
        splits = self.data.get("splits", {})
        if split not in splits:
            raise ImagenetTrainError(
                f"{self.location}: no split '{split}' in the index (has: {', '.join(splits) or 'none'})"
            )
        return list(splits[split]["shardlist"])

    def urls(self, split: str) -> list[str]:
        base = storage.parent(self.location)
        return [storage.join(base, shard["url"]) for shard in self.shards(split)]

    def sizes(self, split: str) -> list[int]:
        return [int(shard["nsamples"]) for shard in self.shards(split)]

    def filesizes(self, split: str) -> list[int | None]:
        """Each shard's size in bytes as the index records it (None where it does not)."""
        return [int(shard["filesize"]) if "filesize" in shard else None for shard in self.shards(split)]

    def nsamples(self, split: str) -> int:
        return sum(self.sizes(split))


def index_location(location: str) -> str:
    """The index file for a directory, a directory URL, or the index itself."""
    if location.endswith(".json"):
        return location
    if storage.is_url(location) or location.startswith("file://"):
        return location.rstrip("/") + "/" + INDEX_NAME
    return os.path.join(location, INDEX_NAME)


def load_index(location: str, io_timeout: float = 900.0) -> ShardIndex:
    """Read and check a shard index from a path, directory or URL."""
    where = index_location(location)
    if not storage.is_url(where) and not os.path.exists(storage.local_path(where)):
        raise ImagenetTrainError(f"{where}: no shard index here (run `imagenet-train shards` first)")
    raw = storage.read_bytes(where, io_timeout=io_timeout)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ImagenetTrainError(f"{where}: not a JSON shard index ({error.msg} at line {error.lineno})") from None
    if not isinstance(data, dict) or data.get("__kind__") != INDEX_KIND or "splits" not in data:
        raise ImagenetTrainError(f"{where}: expected an imagenet-train index with __kind__ '{INDEX_KIND}'")
    return ShardIndex(location=where, data=data)


def write_json_atomic(path: str, data: dict) -> None:
    """Write JSON so readers never see a half-written file (temp file, fsync, rename)."""
    with atomic_write(path, "w") as stream:
        json.dump(data, stream, indent=1)
        stream.write("\n")


_NUMBERED = re.compile(r"^(.*?)(\d+)(\.[^/]*)$")


def brace(names: Iterable[str]) -> list[str]:
    """Compress shard names into WebDataset brace notation, e.g. `x-{000000..000012}.tar`."""
    groups: list[list] = []  # [prefix, suffix, width, first, last]
    result: list[str] = []
    for name in names:
        match = _NUMBERED.match(name)
        if not match:
            groups.append([name, None, 0, 0, 0])
            continue
        prefix, digits, suffix = match.groups()
        number = int(digits)
        last = groups[-1] if groups else None
        if last and last[1] == suffix and last[0] == prefix and last[2] == len(digits) and last[4] + 1 == number:
            last[4] = number
        else:
            groups.append([prefix, suffix, len(digits), number, number])
    for prefix, suffix, width, first, last in groups:
        if suffix is None:
            result.append(prefix)
        elif first == last:
            result.append(f"{prefix}{first:0{width}d}{suffix}")
        else:
            result.append(f"{prefix}{{{first:0{width}d}..{last:0{width}d}}}{suffix}")
    return result
