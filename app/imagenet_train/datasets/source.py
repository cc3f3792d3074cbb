"""Where a run's shards are: a shard index (or URL specs) resolved into shard URLs, sizes and what each holds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from imagenet_train.config import IO_TIMEOUT, MAX_CLASSES, DataConfig
from imagenet_train.datasets.index import ShardIndex, check_class_count, load_index
from imagenet_train.errors import ImagenetTrainError


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


def run_source(data: DataConfig) -> DataSource:
    """The shards a run's data settings name: what every launcher trains on."""
    return resolve_source(
        data.shards,
        data.train_urls,
        data.val_urls,
        data.train_samples,
        data.num_classes,
        data.io_timeout,
        data.trust_index,
        data.max_classes,
    )
