"""Progressive resizing over persistent loader workers (and DALI's CPU backend), evaluation at its own size,
and the augmentation policies in the workers."""

import pytest
import torch

from imagenet_train.choices import AutoAugment, Decoder
from imagenet_train.config import Config
from imagenet_train.datasets.source import resolve_source
from imagenet_train.loading import dali
from imagenet_train.loading.batches import train_loader, val_loader
from imagenet_train.loading.fused_decoder import available as fused_available
from imagenet_train.loading.presets import TrainPreset
from imagenet_train.loading.stream import EpochLoader, ShardStream
from imagenet_train.planning.resolution import CropSchedule
from imagenet_train.planning.schedule import Schedule

CPU = torch.device("cpu")
RAMP = CropSchedule(32, start_size=32, end_size=96, start_epoch=0, end_epoch=2)  # 32, 64, 96 px


def worker_pids(loader: EpochLoader) -> list[int]:
    return [worker.pid for worker in loader.loader._iterator._workers]


def resampled_loader(urls, transform, batches: int = 3, **options) -> EpochLoader:
    stream = ShardStream(urls=urls, transform=transform, batch_size=8, resampled=True, **options)
    return EpochLoader(stream, workers=2, batches=batches, crop_sizes=RAMP)


@pytest.mark.parametrize("decoder", [Decoder.SIMPLEJPEG, Decoder.FUSED, Decoder.PIL])
def test_batches_follow_the_crop_schedule_epoch_by_epoch_on_the_same_workers(digit_shards, decoder):
    if decoder == Decoder.FUSED and not fused_available():
        pytest.skip("needs PyTurboJPEG and libturbojpeg")
    source = resolve_source(str(digit_shards))
    loader = resampled_loader(source.train_urls, TrainPreset(32, 0.5, decoder=decoder).build())
    pids = None
    try:
        for epoch, size in enumerate(RAMP.sizes(3)):
            loader.start_epoch(epoch, batches=3)
            assert loader.epoch_report() == {"train_crop_size": size}
            shapes = {tuple(images.shape[1:]) for images, _, _ in loader}
            assert shapes == {(3, size, size)}
            pids = pids or worker_pids(loader)
            assert worker_pids(loader) == pids  # persistent: the size reached them without a restart
    finally:
        loader.close()


@pytest.mark.skipif(not dali.available(), reason="NVIDIA DALI not installed (pip install '.[dali]')")
def test_dali_batches_follow_the_crop_schedule_on_the_same_workers(digit_shards):
    source = resolve_source(str(digit_shards))
    loader = resampled_loader(source.train_urls, dali.jpeg_bytes, collate_fn=dali.pack_jpegs)
    decoder = dali.DaliDecoder(loader, dali.DaliAugment(32, normalized=False), 8, CPU, threads=1)
    pids = None
    try:
        for epoch, size in enumerate(RAMP.sizes(3)):
            loader.start_epoch(epoch, batches=3)
            shapes = [tuple(images.shape[1:]) for images, _, _ in decoder]
            assert shapes == [(3, size, size)] * 3
            pids = pids or worker_pids(loader)
            assert worker_pids(loader) == pids
    finally:
        loader.close()


def test_evaluation_batches_have_the_val_crop_size_while_training_uses_another(digit_shards):
    cfg = Config()
    cfg.data.shards, cfg.loader.workers, cfg.loader.batch_size, cfg.loader.epoch_batches = str(digit_shards), 1, 8, 2
    cfg.augment.train_crop_size, cfg.augment.val_resize_size, cfg.augment.val_crop_size = 32, 56, 48
    source = resolve_source(str(digit_shards))
    schedule = Schedule.of(cfg, source.train_samples, source.train_sizes, 1)
    train = train_loader(cfg, 0, 1, CPU, source, schedule.epoch_batches(0))
    val = val_loader(cfg, 0, 1, CPU, source)
    try:
        train.start_epoch(0, batches=2)
        assert {tuple(images.shape[1:]) for images, _, _ in train} == {(3, 32, 32)}
        assert {tuple(images.shape[1:]) for images, _, _ in val} == {(3, 48, 48)}
    finally:
        train.close()
        val.close()


def first_batch(urls, preset: TrainPreset) -> torch.Tensor:
    torch.manual_seed(7)  # the workers' seeds come from it: the same crops in both runs
    stream = ShardStream(urls=urls, transform=preset.build(), batch_size=16, shuffle_shards=False, shuffle_buffer=0)
    loader = EpochLoader(stream, workers=1)
    try:
        return next(iter(loader))[0]
    finally:
        loader.close()


@pytest.mark.parametrize(("policy", "erase"), [(AutoAugment.TA_WIDE, 0.0), (AutoAugment.NONE, 1.0)])
def test_augmentation_in_the_workers_changes_the_pixels_and_keeps_uint8_crops(digit_shards, policy, erase):
    urls = resolve_source(str(digit_shards)).val_urls
    plain = first_batch(urls, TrainPreset(32, 0.5))
    again = first_batch(urls, TrainPreset(32, 0.5))
    augmented = first_batch(urls, TrainPreset(32, 0.5, auto_augment=policy, random_erase=erase))
    assert torch.equal(plain, again)  # the seed fixes the crops: any difference is the augmentation's
    assert augmented.dtype == torch.uint8 and augmented.shape == plain.shape
    assert not torch.equal(augmented, plain)


@pytest.mark.skipif(not dali.available(), reason="NVIDIA DALI not installed (pip install '.[dali]')")
@pytest.mark.parametrize("policy", [AutoAugment.TA_WIDE, AutoAugment.RA, AutoAugment.IMAGENET])
def test_dali_policies_change_the_pixels_and_keep_uint8_crops(digit_shards, policy):
    urls = resolve_source(str(digit_shards)).val_urls

    def images(augment: dali.DaliAugment) -> torch.Tensor:
        stream = ShardStream(
            urls=urls, transform=dali.jpeg_bytes, collate_fn=dali.pack_jpegs, batch_size=16, shuffle_buffer=0
        )
        return next(iter(dali.DaliDecoder(EpochLoader(stream, workers=0), augment, 16, CPU, threads=1, seed=3)))[0]

    plain = images(dali.DaliAugment(32, normalized=False))
    assert torch.equal(plain, images(dali.DaliAugment(32, normalized=False)))
    augmented = images(dali.DaliAugment(32, normalized=False, auto_augment=policy))
    assert augmented.dtype == torch.uint8 and augmented.shape == plain.shape
    assert not torch.equal(augmented, plain)
