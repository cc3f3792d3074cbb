"""The step's input path: cached normalisation, shard-mixing batches without a main-process restack,
DataLoader workers that persist across epochs, and the device copy one step ahead."""

import tarfile
from collections import Counter

import pytest
import torch

from imagenet_train.datasets.source import resolve_source
from imagenet_train.loading.device import device_batches
from imagenet_train.loading.presets import ValPreset
from imagenet_train.loading.stream import EpochLoader, ShardStream
from imagenet_train.training.batch_input import normalize, normalize_constants


def shard_of_keys(urls: list[str]) -> dict[str, str]:
    """Which shard each sample key lives in."""
    owner = {}
    for url in urls:
        with tarfile.open(url) as tar:
            for name in tar.getnames():
                owner[name.split(".", 1)[0]] = url
    return owner


def stream(urls, resampled=True, **kw):
    return ShardStream(urls=urls, transform=ValPreset(16, 16).build(), batch_size=32, resampled=resampled, **kw)


def test_normalisation_constants_are_made_once_per_device():
    first = normalize_constants(torch.device("cpu"))
    assert all(a is b for a, b in zip(first, normalize_constants(torch.device("cpu")), strict=True))
    images = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    out = normalize(images)
    assert out.dtype == torch.float32
    expected = torch.tensor([(1 - 0.485) / 0.229, (1 - 0.456) / 0.224, (1 - 0.406) / 0.225])
    assert torch.allclose(out[0, :, 0, 0], expected)
    assert normalize(out) is out  # a float batch (DALI's) is already normalised


def test_resampled_batches_mix_several_shards_within_one_worker(digit_shards):
    source = resolve_source(str(digit_shards))
    owner = shard_of_keys(source.train_urls)
    loader = EpochLoader(stream(source.train_urls, shuffle_buffer=100), workers=1, batches=12)
    per_batch = [len({owner[key] for key in keys}) for _, _, keys in loader]
    assert len(per_batch) == 12
    # One worker, so every mix comes from its interleaved shards, not from re-mixing across workers.
    assert min(per_batch) >= 3, per_batch


def test_a_single_open_shard_per_worker_would_not_mix(digit_shards):
    source = resolve_source(str(digit_shards))
    owner = shard_of_keys(source.train_urls)
    loader = EpochLoader(stream(source.train_urls, shuffle_buffer=0, interleave=1), workers=1, batches=8)
    assert max(len({owner[key] for key in keys}) for _, _, keys in loader) <= 2  # the test above can fail


def test_resampled_batches_arrive_as_the_workers_stacked_them(digit_shards):
    """No restack in the training process: the batch is still the worker's shared-memory tensor."""
    source = resolve_source(str(digit_shards))
    loader = EpochLoader(stream(source.train_urls), workers=2, batches=4)
    batches = list(loader)
    assert len(batches) == 4 and all(images.is_shared() for images, _, _ in batches)
    loader.close()


def test_workers_persist_across_epochs_and_follow_the_epoch(digit_shards):
    source = resolve_source(str(digit_shards))
    loader = EpochLoader(stream(source.train_urls, resampled=False, shuffle_buffer=50), workers=2)
    orders, pids = [], []
    for epoch in (0, 1, 2):
        loader.set_epoch(epoch)
        keys = [key for _, _, batch in loader for key in batch]
        assert Counter(keys) == Counter(set(keys)) and len(keys) == source.train_samples  # every sample once
        orders.append(keys)
        pids.append(sorted(worker.pid for worker in loader.loader._iterator._workers))
    assert pids[0] == pids[1] == pids[2]  # the same worker processes every epoch
    assert orders[0] != orders[1] != orders[2]  # and they read each epoch's own shard order
    again = EpochLoader(stream(source.train_urls, resampled=False, shuffle_buffer=50), workers=2, persistent=False)
    again.set_epoch(1)
    assert [key for _, _, batch in again for key in batch] == orders[1]  # same as a fresh loader's epoch 1
    loader.close()


def test_resumed_epoch_skip_keys_reach_persistent_workers(digit_shards):
    source = resolve_source(str(digit_shards))
    data = stream(source.train_urls, resampled=False, shuffle_buffer=0)
    loader = EpochLoader(data, workers=2)
    first = [key for _, _, batch in loader for key in batch]
    loader.start_epoch(0, skip_keys=first[:500])
    rest = [key for _, _, batch in loader for key in batch]
    assert sorted(rest) == sorted(first[500:])
    loader.close()


def test_a_resumed_resampled_epoch_takes_its_own_length_and_fresh_draws(digit_shards):
    source = resolve_source(str(digit_shards))
    loader = EpochLoader(stream(source.train_urls, shuffle_buffer=0), workers=2, batches=6)
    first = [batch for _, _, batch in loader]
    loader.start_epoch(0, resume_tag=":resume3", batches=3)
    resumed = [batch for _, _, batch in loader]
    assert len(first) == 6 and len(resumed) == 3
    assert resumed != first[:3]  # the resumed part draws anew instead of repeating the epoch's start
    loader.start_epoch(0, batches=6)
    assert [batch for _, _, batch in loader] == first  # and an epoch started afresh draws as before
    loader.close()


def test_device_batches_pass_through_on_cpu():
    batches = [(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.tensor([1, 2]), ["a", "b"])]
    assert list(device_batches(batches, torch.device("cpu"))) == batches


@pytest.mark.cuda
def test_device_batches_copy_ahead_without_host_sync():
    images = torch.randint(0, 255, (8, 3, 16, 16), dtype=torch.uint8).pin_memory()
    batches = [(images, torch.arange(8).pin_memory(), [])]
    device = torch.device("cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = [(normalize(images), labels) for images, labels, _ in device_batches(batches * 4, device)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(images.is_cuda and labels.is_cuda for images, labels in out)
    assert torch.equal(out[0][1].cpu(), torch.arange(8))
