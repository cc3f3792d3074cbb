"""The early-yielding shuffle buffer in the loader's workers: while it grows (a buffer larger than a worker's share,
so it never fills) an epoch still gives every sample once, in the same order from a fresh loader, and a mid-epoch
resume gives exactly the samples not yet consumed."""

from collections import Counter

from imagenet_train.datasets.source import resolve_source
from imagenet_train.loading.presets import ValPreset
from imagenet_train.loading.stages import SHUFFLE_INITIAL, ShardReading
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


class Counting:
    """A transform that counts the images it decoded (in this process: the stream is iterated without workers)."""

    def __init__(self, transform) -> None:
        self.transform, self.calls = transform, 0

    def __call__(self, data: bytes):
        self.calls += 1
        return self.transform(data)


def test_a_cold_epochs_first_batch_waits_for_its_own_decoding_only_and_the_batches_are_the_same(digit_shards):
    # Holding each batch until the next one was full made the first batch wait for two batches' decoding.
    source = resolve_source(str(digit_shards))

    def stream(transform, expected, skip_keys=frozenset(), repeat=1) -> ShardStream:
        reading = ShardReading(expected=source.expected if expected else {})
        return ShardStream(
            urls=source.train_urls,
            transform=transform,
            batch_size=32,
            resampled=False,
            reading=reading,
            skip_keys=skip_keys,
            repeat=repeat,
        )

    counting = Counting(ValPreset(16, 16).build())
    batches = iter(stream(counting, expected=True))
    next(batches)
    assert counting.calls == 32
    known = [keys for _, _, keys in stream(ValPreset(16, 16).build(), expected=True)]
    unknown = [keys for _, _, keys in stream(ValPreset(16, 16).build(), expected=False)]
    assert known == unknown and sum(map(len, known)) == source.train_samples
    consumed = frozenset(key for keys in known[:5] for key in keys) | {known[-1][0]}
    resumed = [keys for _, _, keys in stream(ValPreset(16, 16).build(), True, consumed)]
    assert sorted(k for keys in resumed for k in keys) == sorted(k for keys in known for k in keys if k not in consumed)
    assert min(map(len, resumed)) >= 16  # a resumed epoch's tail is still never a batch below half the batch size
    # --repeat 2 reads each shard twice, so each consumed key is skipped twice: still the same batches.
    twice = [keys for _, _, keys in stream(ValPreset(16, 16).build(), True, consumed, repeat=2)]
    assert twice == [keys for _, _, keys in stream(ValPreset(16, 16).build(), False, consumed, repeat=2)]
