"""Where a run's shards are: the shard index `shards.json` (WebDataset's wids-shard-index-v1 plus classes, splits
and checksums; `ShardIndex`), and an index or URL specs resolved into shard URLs, sizes and what each holds
(`DataSource`)."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeGuard

from imagenet_train.config import DataConfig
from imagenet_train.errors import ImagenetTrainError, clip
from imagenet_train.io import schemes, storage
from imagenet_train.io.atomic import atomic_write
from imagenet_train.limits import IO_TIMEOUT, MAX_CLASSES

INDEX_NAME = "shards.json"
INDEX_KIND = "wids-shard-index-v1"


# An index is untrusted input, read whole on every node: 64 MiB is ~60x the index of full ImageNet (1,400 shards
# with their checksums and conversion report, about 1 MB) and room for ~250,000 shards, while its parsed
# form (several times the bytes) still fits beside a training process on each rank.
MAX_INDEX_BYTES = 64 << 20

# The smallest sample the loader can use is two tar members (the image and its class), each a 512-byte
# header and at least one 512-byte data block, since neither may be empty: 2048 bytes. Headers for long names
# and the end-of-archive blocks only add to it, so no shard holds more than filesize // 2048 usable samples.
MIN_SAMPLE_BYTES = 4 * 512
# Where an index gives no filesize: the most `imagenet-train shards --maxcount` writes in one shard.
MAX_SHARD_SAMPLES = 10_000_000
# Per split: far beyond any image dataset (ImageNet-21k has 14 million). `plan --simulate` is bounded apart
# from this, by what the shards really hold (loading/simulate.py).
MAX_SPLIT_SAMPLES = 10_000_000_000

_HEX = {"sha256": re.compile(r"[0-9a-fA-F]{64}"), "md5sum": re.compile(r"[0-9a-fA-F]{32}")}

log = logging.getLogger(__name__)


@dataclass
class ShardIndex:
    """A loaded, checked index; shard URLs in it are resolved relative to where it was read from."""

    location: str
    data: dict = field(repr=False)
    resolved: dict[str, list[str]] = field(default_factory=dict, repr=False)  # split -> shard URLs

    @property
    def classes(self) -> list[str]:
        """The class names, in label order."""
        return list(self.data.get("classes", []))

    def splits(self) -> list[str]:
        """The names of the index's splits."""
        return list(self.data.get("splits", {}))

    def shards(self, split: str) -> list[dict]:
        """The shard entries of `split`; a split the index lacks is a one-line error."""
        splits = self.data.get("splits", {})
        if split not in splits:
            raise ImagenetTrainError(
                f"{self.location}: no split '{clip(split)}' in the index (has: {clip(', '.join(splits)) or 'none'})"
            )
        return list(splits[split]["shardlist"])

    def urls(self, split: str) -> list[str]:
        """The shard URLs of `split`, each resolved (and checked) when the index was loaded."""
        self.shards(split)  # the one error for a missing split
        return list(self.resolved[split])

    def sizes(self, split: str) -> list[int]:
        """Each shard's number of samples in `split`."""
        return [shard["nsamples"] for shard in self.shards(split)]

    def filesizes(self, split: str) -> list[int | None]:
        """Each shard's size in bytes as the index records it (None where it does not)."""
        return [shard.get("filesize") for shard in self.shards(split)]

    def checksums(self, split: str) -> list[str | None]:
        """Each shard's sha256 as the index records it (None where it does not); a malformed one is refused."""
        from imagenet_train.io.integrity import is_sha256

        sums = [shard.get("sha256") for shard in self.shards(split)]
        for shard, value in zip(self.shards(split), sums, strict=True):
            if value is not None and not is_sha256(value):
                raise ImagenetTrainError(
                    f"{self.location}: shard '{str(shard.get('url'))[:80]}': sha256 is not 64 lowercase hex digits"
                )
        return sums

    def nsamples(self, split: str) -> int:
        """The number of samples in `split`."""
        return sum(self.sizes(split))


def index_location(location: str) -> str:
    """The index file for a directory, a directory URL, or the index itself."""
    if location.endswith(".json"):
        return location
    if storage.is_url(location) or location.startswith("file://"):
        return location.rstrip("/") + "/" + INDEX_NAME
    return os.path.join(location, INDEX_NAME)


def load_index(
    location: str, io_timeout: float = IO_TIMEOUT, trust_index: bool = False, max_classes: int = MAX_CLASSES
) -> ShardIndex:
    """Read and check a shard index from a path, directory or URL.

    Every shard URL must name a file in the index's own folder unless `trust_index` (the --trust-index flag)
    says the index's author may name any URL, local path or pipe: command. More than `max_classes` class
    names is refused before anything is sized by them.
    """
    where = index_location(location)
    if not storage.is_url(where) and not os.path.exists(storage.local_path(where)):
        raise ImagenetTrainError(f"{where}: no shard index here (run `imagenet-train shards` first)")
    raw = storage.read_bytes(where, io_timeout=io_timeout, limit=MAX_INDEX_BYTES)
    try:
        data = json.loads(raw)  # NaN and Infinity become floats, which no checked field accepts
    except (ValueError, RecursionError) as error:
        detail = f"{error.msg} at line {error.lineno}" if isinstance(error, json.JSONDecodeError) else clip(error)
        raise ImagenetTrainError(f"{where}: not a JSON shard index ({detail})") from None
    if not isinstance(data, dict) or data.get("__kind__") != INDEX_KIND or "splits" not in data:
        raise ImagenetTrainError(f"{where}: expected an imagenet-train index with __kind__ '{INDEX_KIND}'")
    if trust_index:
        log.warning("--trust-index: %s may name any URL, local path or pipe: command as a shard", where)
    resolved = check_index(data, where, trust_index, max_classes)
    return ShardIndex(location=where, data=data, resolved=resolved)


def check_index(
    data: dict, where: str, trust_index: bool = False, max_classes: int = MAX_CLASSES
) -> dict[str, list[str]]:
    """Check the fields the code reads, naming the file, split, entry and what was expected; returns each
    split's resolved shard URLs."""
    classes = data.get("classes", [])
    if not isinstance(classes, list) or not all(isinstance(name, str) for name in classes):
        raise ImagenetTrainError(f"{where}: classes: expected a list of class names (text)")
    check_class_count(len(classes), max_classes, f"{where}: classes")
    splits = data["splits"]
    if not isinstance(splits, dict):
        raise ImagenetTrainError(f"{where}: splits: expected a mapping of split names to shard lists")
    base = storage.parent(where)
    resolved = {}
    for split, info in splits.items():
        at = f"{where}: split '{clip(split)}'"
        if not isinstance(info, dict) or not isinstance(info.get("shardlist"), list):
            raise ImagenetTrainError(f"{at}: expected a mapping with a 'shardlist' list, got '{clip(info)}'")
        urls, total = [], 0
        for number, shard in enumerate(info["shardlist"]):
            total += _check_shard(shard, f"{at} shard {number}")
            try:
                urls.append(storage.join(base, shard["url"], trusted=trust_index))
            except ImagenetTrainError as error:
                raise ImagenetTrainError(f"{at} shard {number}: url {error} (or --trust-index)") from None
            schemes.scheme_for(urls[-1], f"{at} shard {number}: url")  # --trust-index lets any name in: one we read
        if total > MAX_SPLIT_SAMPLES:
            raise ImagenetTrainError(f"{at}: {total} samples; expected at most {MAX_SPLIT_SAMPLES}")
        resolved[split] = urls
    return resolved


def check_class_count(count: int, max_classes: int, what: str) -> None:
    """Refuse `count` classes above `max_classes` (they size the model on every rank), naming `what`."""
    if count > max_classes:
        raise ImagenetTrainError(
            f"{what}: {count} classes; expected at most {max_classes} (--max-classes raises the limit)"
        )


def _check_shard(shard: object, at: str) -> int:
    """The samples of one shard entry, after checking its fields and that its size can hold them."""
    if not isinstance(shard, dict):
        raise ImagenetTrainError(f"{at}: expected a mapping with url and nsamples, got '{clip(shard)}'")
    if not isinstance(shard.get("url"), str):
        raise ImagenetTrainError(f"{at}: url: expected text, got '{clip(shard.get('url'))}'")
    nsamples, filesize = shard.get("nsamples"), shard.get("filesize")
    expected = f"a whole number from 0 to {MAX_SHARD_SAMPLES}"
    if not _count(nsamples):
        raise ImagenetTrainError(f"{at}: nsamples: expected {expected}, got '{clip(nsamples)}'")
    if "filesize" in shard:
        if not _count(filesize):
            raise ImagenetTrainError(f"{at}: filesize: expected a whole number of bytes >= 0, got '{clip(filesize)}'")
        if nsamples > filesize // MIN_SAMPLE_BYTES:
            raise ImagenetTrainError(
                f"{at}: {nsamples} samples cannot fit in {filesize} bytes "
                f"(a sample takes at least {MIN_SAMPLE_BYTES} bytes of tar)"
            )
    if nsamples > MAX_SHARD_SAMPLES:
        raise ImagenetTrainError(f"{at}: nsamples: expected {expected}, got {nsamples}")
    for key, pattern in _HEX.items():
        if key in shard and not (isinstance(shard[key], str) and pattern.fullmatch(shard[key])):
            raise ImagenetTrainError(f"{at}: {key}: expected {pattern.pattern}, got '{clip(shard[key])}'")
    return nsamples


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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


@dataclass(frozen=True)
class ShardInfo:
    """What the index says one shard holds."""

    samples: int
    filesize: int | None = None
    sha256: str | None = None


def expected_shards(index: ShardIndex, splits: Iterable[str]) -> dict[str, ShardInfo]:
    """What a loaded shard index says each shard of `splits` holds, by URL."""
    return {
        url: ShardInfo(samples, filesize, sha256)
        for split in splits
        for url, samples, filesize, sha256 in zip(
            index.urls(split), index.sizes(split), index.filesizes(split), index.checksums(split), strict=True
        )
    }


@dataclass(frozen=True)
class DataSource:
    """Where the shards are and how big the splits are."""

    train_urls: list[str]
    val_urls: list[str]
    train_sizes: list[int] | None
    train_samples: int
    num_classes: int
    expected: Mapping[str, ShardInfo] = field(default_factory=dict)  # per URL, from the index


def expand_urls(spec: str) -> list[str]:
    """A WebDataset URL spec (brace notation, `::`-separated lists) as a list of URLs."""
    from braceexpand import braceexpand

    return [url for part in spec.split("::") if part for url in braceexpand(part)]


def resolve_source(
    shards: str,
    train_urls: str = "",
    val_urls: str = "",
    train_samples: int = 0,
    num_classes: int = 0,
    io_timeout: float = IO_TIMEOUT,
    trust_index: bool = False,
    max_classes: int = MAX_CLASSES,
) -> DataSource:
    """Read the shard index (or take explicit URL specs) into lists of URLs and counts.

    The index's shard URLs must lie in its own folder unless `trust_index`; URL specs the user gives
    (`--train-urls`, pipe: included) are the user's own and used as given. Either way the class count is at
    most `max_classes`, checked before any model is built.
    """
    check_class_count(num_classes, max_classes, "--num-classes")
    if shards:
        index = load_index(shards, io_timeout=io_timeout, trust_index=trust_index, max_classes=max_classes)
        sizes = index.sizes("train")
        splits = [split for split in ("train", "val") if split in index.splits()]
        expected = expected_shards(index, splits)
        return DataSource(
            train_urls=index.urls("train"),
            val_urls=index.urls("val") if "val" in splits else [],
            train_sizes=sizes,
            train_samples=sum(sizes),
            num_classes=num_classes or len(index.classes),
            expected=expected,
        )
    if num_classes < 1:
        raise ImagenetTrainError("--num-classes: required when shards are given as --train-urls")
    urls = expand_urls(train_urls)
    if not urls:
        raise ImagenetTrainError(f"--train-urls: '{train_urls}' names no shards")
    return DataSource(urls, expand_urls(val_urls), None, train_samples, num_classes)


def run_source(data: DataConfig, io_timeout: float = IO_TIMEOUT) -> DataSource:
    """The shards a run's data settings name, an outage of their server waited out up to `io_timeout` seconds
    (--io-timeout): what every launcher trains on."""
    return resolve_source(
        data.shards,
        data.train_urls,
        data.val_urls,
        data.train_samples,
        data.num_classes,
        io_timeout,
        data.trust_index,
        data.max_classes,
    )
