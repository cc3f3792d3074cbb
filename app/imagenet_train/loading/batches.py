"""A run's batches on the device: the train and val loaders built from the run's data settings, decoded by the
loader workers or by DALI, and copied to the device one step ahead of the step that uses them.

The training package asks for an epoch of batches and never sees a decoder.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import cast

import torch

from imagenet_train.choices import Decoder, Mode
from imagenet_train.config import Config, LoaderConfig
from imagenet_train.datasets.source import DataSource
from imagenet_train.loading.batching import Batch
from imagenet_train.loading.dali import DaliAugment, DaliDecoder, JpegBatch, jpeg_bytes, pack_jpegs
from imagenet_train.loading.device import device_batches
from imagenet_train.loading.presets import TrainPreset, ValPreset
from imagenet_train.loading.shard_queue import job_queue
from imagenet_train.loading.stages import ShardReading
from imagenet_train.loading.stream import EpochLoader, ShardStream
from imagenet_train.loading.workers import worker_context
from imagenet_train.planning.resolution import CropSchedule
from imagenet_train.planning.seeds import augmentation_seed


def shard_reading(loader: LoaderConfig, source: DataSource) -> ShardReading:
    """How the loaders read shards: the outage budget, broken-shard policy, expected sizes and cache."""
    return ShardReading(
        loader.io_timeout,
        loader.on_broken_shard,
        source.expected,
        loader.cache_dir,
        loader.verify_shards,
        loader.cache_max_bytes,
    )


def _per_sample(loader: LoaderConfig, preset: TrainPreset | ValPreset) -> tuple:
    """The workers' per-sample transform and collate: the JPEG bytes for DALI to decode in the rank, else the
    preset's decode and augmentation."""
    if loader.decoder == Decoder.DALI:
        return partial(jpeg_bytes, max_pixels=loader.max_image_pixels), pack_jpegs
    return preset.build(), None


def train_loader(
    cfg: Config,
    rank: int,
    world: int,
    device: torch.device,
    source: DataSource,
    batches: int,
    queue=None,
    epoch_length: float = 1.0,
) -> EpochLoader:
    """This rank's training batches: `batches` per rank in resampled mode, every sample once otherwise; each loop
    epoch is `epoch_length` data epochs long for the progressive resizing ramp."""
    loader, augment = cfg.loader, cfg.augment
    exact = loader.mode in (Mode.SPLIT, Mode.QUEUE)
    preset = TrainPreset(
        augment.train_crop_size,
        augment.min_crop_scale,
        augment.hflip,
        loader.decoder,
        loader.max_image_pixels,
        augment.auto_augment,
        augment.random_erase,
        augment.interpolation,
    )
    transform, collate = _per_sample(loader, preset)
    stream = ShardStream(
        urls=source.train_urls,
        transform=transform,
        collate_fn=collate,
        batch_size=loader.batch_size,
        rank=rank,
        world=world,
        resampled=not exact,
        queue=queue,
        repeat=loader.repeat,
        shuffle_buffer=loader.shuffle_buffer,
        seed=cfg.run.seed,
        reading=shard_reading(loader, source),
        num_classes=source.num_classes,
        max_corrupt_streak=loader.max_corrupt_streak,
        ra_reps=max(1, loader.ra_reps),
    )
    pin = device.type == "cuda" and loader.decoder != Decoder.DALI
    return EpochLoader(
        stream,
        loader.workers,
        None if exact else batches,
        pin_memory=pin,
        timeout=loader.loader_timeout,
        crop_sizes=CropSchedule.of(augment, epoch_length),
    )


def val_loader(cfg: Config, rank: int, world: int, device: torch.device, source: DataSource) -> EpochLoader | None:
    """This rank's share of the validation shards, read once in order (None without val shards)."""
    if not source.val_urls:
        return None
    loader, augment = cfg.loader, cfg.augment
    transform, collate = _per_sample(
        loader,
        ValPreset(
            augment.eval_crop_size(), augment.val_resize_size or None, loader.max_image_pixels, augment.interpolation
        ),
    )
    stream = ShardStream(
        urls=source.val_urls,
        transform=transform,
        collate_fn=collate,
        batch_size=loader.batch_size,
        rank=rank,
        world=world,
        resampled=False,
        shuffle_shards=False,
        shuffle_buffer=0,
        reading=shard_reading(loader, source),
        num_classes=source.num_classes,
        max_corrupt_streak=loader.max_corrupt_streak,
    )
    pin = device.type == "cuda" and loader.decoder != Decoder.DALI
    return EpochLoader(stream, loader.workers, pin_memory=pin, timeout=loader.loader_timeout)


def run_queue(mode: Mode, world: int, distributed: bool):
    """The run's shard queue in queue mode (None otherwise), under a name no earlier attempt of this run used:
    rank 0 draws it and every rank takes rank 0's."""
    if mode != Mode.QUEUE:
        return None
    generation = torch.randint(0, 2**62, (1,), dtype=torch.int64)
    if distributed:
        torch.distributed.broadcast(generation, src=0)
    return job_queue(f"imagenet-train/queue/{int(generation)}", world, worker_context())


class RunBatches:
    """A run's train and val loaders and the device-ready batches of each epoch: uint8 NCHW images, labels, keys."""

    def __init__(
        self,
        cfg: Config,
        rank: int,
        world: int,
        device: torch.device,
        source: DataSource,
        batches: int,
        epoch_length: float = 1.0,
    ):
        self.cfg, self.rank, self.device = cfg, rank, device
        queue = run_queue(cfg.loader.mode, world, world > 1)
        self.train = train_loader(cfg, rank, world, device, source, batches, queue, epoch_length)
        self.val = val_loader(cfg, rank, world, device, source)
        augment = cfg.augment
        self.augment = {
            self.train: DaliAugment(
                augment.train_crop_size,
                True,
                augment.min_crop_scale,
                augment.hflip,
                auto_augment=augment.auto_augment,
                interpolation=augment.interpolation,
            ),
            self.val: DaliAugment(
                augment.eval_crop_size(),
                False,
                resize=augment.val_resize_size or None,
                interpolation=augment.interpolation,
            ),
        }
        self.dali: dict[EpochLoader, DaliDecoder] = {}  # made on first use

    def train_batches(self) -> Iterable[Batch]:
        """The epoch the train loader was last started at (`self.train.start_epoch`), on the device."""
        return self._on_device(self.train)

    def val_batches(self) -> Iterable[Batch]:
        """Every rank's share of the val shards once, on the device (empty without val shards)."""
        return self._on_device(self.val) if self.val is not None else ()

    def _on_device(self, loader: EpochLoader) -> Iterable[Batch]:
        settings = self.cfg.loader
        if settings.decoder != Decoder.DALI:
            return device_batches(loader, self.device)
        if loader not in self.dali:
            self.dali[loader] = DaliDecoder(
                cast(Iterable[JpegBatch], loader),  # its collate is pack_jpegs (_per_sample)
                self.augment[loader],
                settings.batch_size,
                self.device,
                threads=max(settings.workers, 1),
                seed=augmentation_seed(self.cfg.run.seed, self.rank),
            )
        return device_batches(self.dali[loader], self.device)

    def abandon(self) -> None:
        """After a stop signal in a wait: kill both loaders' workers at once (asleep in an outage, each would hold
        the loader's shutdown for 5 s), then close the loaders."""
        from torch.utils.data._utils import signal_handling

        for loader in (self.train, self.val):
            iterator = getattr(getattr(loader, "loader", None), "_iterator", None)
            if iterator is None:
                continue
            if getattr(iterator, "_worker_pids_set", False):  # else torch's SIGCHLD handler takes the kill for a crash
                signal_handling._remove_worker_pids(id(iterator))
                iterator._worker_pids_set = False
            for worker in getattr(iterator, "_workers", []):
                if worker.is_alive():
                    worker.kill()
        self.close()

    def close(self) -> None:
        """Stop both loaders' workers."""
        for loader in (self.train, self.val):
            if loader is not None:
                loader.close()
