"""The early-yielding shuffle buffer in the loader's workers: while it grows (a buffer larger than a worker's share,
so it never fills) an epoch still gives every sample once, in the same order from a fresh loader, and a mid-epoch
resume gives exactly the samples not yet consumed."""

from collections import Counter

from imagenet_train.datasets.source import resolve_source
from imagenet_train.loading.presets import ValPreset
from imagenet_train.loading.stages import SHUFFLE_INITIAL
from imagenet_train.loading.stream import EpochLoader, ShardStream


def split_loader(urls: list[str], persistent: bool = True) -> EpochLoader:
    stream = ShardStream(
        urls=urls, transform=ValPreset(16, 16).build(), batch_size=32, resampled=False, shuffle_buffer=1000
    )
    return EpochLoader(stream, workers=2, persistent=persistent)


def keys_of(loader: EpochLoader) -> list[str]:
    return [key for _, _, batch in loader for key in batch]


def test_a_growing_buffer_keeps_every_sample_once_its_order_and_an_exact_mid_epoch_resume(digit_shards):
    source = resolve_source(str(digit_shards))
    assert SHUFFLE_INITIAL < source.train_samples // 2 < 1000  # each worker's share: past the start, short of full
    loader = split_loader(source.train_urls)
    first = keys_of(loader)
    assert Counter(first) == Counter(set(first)) and len(first) == source.train_samples
    loader.start_epoch(0, skip_keys=first[:300])
    rest = keys_of(loader)
    assert sorted(rest) == sorted(first[300:])  # what a checkpoint after 300 samples leaves, exactly
    loader.close()
    assert keys_of(split_loader(source.train_urls, persistent=False)) == first  # a fresh loader, the same order
