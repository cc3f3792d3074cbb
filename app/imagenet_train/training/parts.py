"""The parts a run is built from, shared by the trainer and the Lightning module: the optimizer's
parameter groups, the autocast dtype, each rank's augmentation seed, the planner's pre-flight verdict and the
train and val loaders."""

from __future__ import annotations

from functools import partial

import torch

from imagenet_train.config import Amp, Config
from imagenet_train.datasets.source import DataSource
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.loading.dali import jpeg_bytes, pack_jpegs
from imagenet_train.loading.options import Decoder
from imagenet_train.loading.presets import TrainPreset, ValPreset
from imagenet_train.loading.stages import ShardReading
from imagenet_train.loading.stream import EpochLoader, ShardStream
from imagenet_train.planning import plan
from imagenet_train.planning.plan import Mode
from imagenet_train.planning.schedule import Schedule
from imagenet_train.training.dist import DistInfo


def augmentation_seed(seed: int, rank: int) -> int:
    """The seed of a rank's augmentation: each rank draws its own crops, reproducibly."""
    return seed + 1000 * rank


def seed_augmentation(seed: int, rank: int) -> None:
    """Seed this process's torch RNG for `rank`'s augmentation (in-process, and the DataLoader workers' seeds).

    Call it after the model is built from the shared seed: every rank must start with the same weights but
    crop differently, or both halves of each global batch get the same crops.
    """
    torch.manual_seed(augmentation_seed(seed, rank))


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on weights only: not on biases and normalisation parameters."""
    decay, no_decay = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (no_decay if parameter.ndim <= 1 else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def amp_dtype(mode: Amp | str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: bf16 on capable GPUs under 'auto', nothing on CPU unless asked."""
    if mode == Amp.OFF or (mode == Amp.AUTO and device.type != "cuda"):
        return None
    if mode == Amp.FP16:
        return torch.float16
    if mode == Amp.AUTO and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def preflight_check(cfg: Config, train_sizes: list[int] | None, world: int) -> plan.Assessment | None:
    """The planner's verdict on `world` ranks training `cfg`; raises if they would hang (unless --force)."""
    if train_sizes is None:
        return None
    setup = plan.Setup.of(cfg.data, cfg.run.seed, train_sizes, gpus_per_node=world)
    assessment = plan.assess(setup)
    if assessment.hangs and not cfg.run.force:
        raise ImagenetTrainError(f"pre-flight: {assessment.verdict}; {assessment.fix} (--force runs anyway)")
    return assessment


def shard_reading(cfg: Config, source: DataSource) -> ShardReading:
    """How the loaders read shards: the outage budget, broken-shard policy, expected sizes and cache."""
    data = cfg.data
    return ShardReading(data.io_timeout, data.on_broken_shard, source.expected, data.cache_dir, data.verify_shards)


def train_loader(cfg: Config, info: DistInfo, source: DataSource, schedule: Schedule, queue=None) -> EpochLoader:
    """This rank's training batches: equal counts per rank in resampled mode, every sample once otherwise."""
    data = cfg.data
    exact = data.mode in (Mode.SPLIT, Mode.QUEUE)
    dali = data.decoder == Decoder.DALI  # workers hand over the JPEG bytes; DALI decodes them in the rank
    preset = TrainPreset(data.image_size, data.min_crop_scale, data.hflip, data.decoder, data.max_image_pixels)
    stream = ShardStream(
        urls=source.train_urls,
        transform=partial(jpeg_bytes, max_pixels=data.max_image_pixels) if dali else preset.build(),
        collate_fn=pack_jpegs if dali else None,
        batch_size=data.batch_size,
        rank=info.rank,
        world=info.world,
        resampled=not exact,
        queue=queue,
        repeat=data.repeat,
        shuffle_buffer=data.shuffle_buffer,
        seed=cfg.run.seed,
        reading=shard_reading(cfg, source),
    )
    return EpochLoader(
        stream,
        data.workers,
        None if exact else schedule.epoch_batches(0),
        pin_memory=info.device.type == "cuda" and not dali,
        timeout=data.loader_timeout,
    )


def val_loader(cfg: Config, info: DistInfo, source: DataSource) -> EpochLoader | None:
    """This rank's share of the validation shards, read once in order (None without val shards)."""
    if not source.val_urls:
        return None
    data = cfg.data
    dali = data.decoder == Decoder.DALI
    stream = ShardStream(
        urls=source.val_urls,
        transform=partial(jpeg_bytes, max_pixels=data.max_image_pixels)
        if dali
        else ValPreset(data.image_size, data.val_resize or None, data.max_image_pixels).build(),
        collate_fn=pack_jpegs if dali else None,
        batch_size=data.batch_size,
        rank=info.rank,
        world=info.world,
        resampled=False,
        shuffle_shards=False,
        shuffle_buffer=0,
        reading=shard_reading(cfg, source),
    )
    pin = info.device.type == "cuda" and not dali
    return EpochLoader(stream, data.workers, pin_memory=pin, timeout=data.loader_timeout)
