"""The model as each rank trains it (on the device, under DDP, compiled) and one optimisation step on a device
batch: normalise, transform the batch (MixUp/CutMix, when on), forward under autocast, scaled backward, clip,
step."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from imagenet_train.choices import Amp
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.loading.normalize import normalize
from imagenet_train.planning.resolution import CropSchedule
from imagenet_train.planning.schedule import ONE_STEP, Accumulation
from imagenet_train.training.dist import DistInfo

log = logging.getLogger(__name__)

COMPILE_BACKEND: str | Callable = "inductor"  # torch.compile's backend for --compile (tests count with others)


def amp_dtype(mode: Amp | str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: bf16 on capable GPUs under 'auto', nothing on CPU unless asked."""
    if mode == Amp.OFF or (mode == Amp.AUTO and device.type != "cuda"):
        return None
    if mode == Amp.FP16:
        return torch.float16
    if mode == Amp.AUTO and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def sync_batchnorm(model: torch.nn.Module, device: torch.device, distributed: bool) -> torch.nn.Module:
    """--sync-bn: every BatchNorm as torch's SyncBatchNorm, across ranks (torchvision's train.py converts only
    when distributed; one process is its own batch). Refused on CPU, where SyncBatchNorm's forward fails."""
    if device.type != "cuda":
        raise ImagenetTrainError(
            f"--sync-bn: needs CUDA (torch's SyncBatchNorm runs on GPUs only, this rank is on {device.type}); "
            "expected --no-sync-bn"
        )
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) if distributed else model


def crop_size_count(crops: CropSchedule) -> int:
    """How many train crop sizes a run can meet, whatever the ramp's clock: its ends and the multiples of its step
    between them."""
    if not crops.progressive:
        return 1
    low, high = sorted((crops.start_size, crops.end_size))
    return len({low, high, *range(-(-low // crops.step) * crops.step, high, crops.step)})


class CompiledForward:
    """--compile: the module compiled once per train crop size, each a static graph (dynamic=False). torch's
    default (dynamic=None) turns the second size into one dynamic-shape graph that every later size shares, and a
    short last batch into a dynamic batch dimension; here a batch that is not full runs the module uncompiled
    (at most two per loader worker and epoch, in split and queue modes: batching.batched's tail), so it compiles
    nothing."""

    def __init__(self, module: torch.nn.Module, batch_size: int, sizes: int, backend: str | Callable = "inductor"):
        self.module, self.batch_size = module, batch_size
        self.compiled = torch.compile(module, dynamic=False, backend=backend)
        # Compiled graphs are cached per code object up to this limit (8 by default); past it torch silently
        # runs the model uncompiled. One entry per crop size, and one spare for a change of grad mode.
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, sizes + 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """The module's output; compiled for a full batch."""
        return (self.compiled if len(images) == self.batch_size else self.module)(images)


def distribute(
    model: torch.nn.Module,
    info: DistInfo,
    channels_last: bool,
    compile_model: bool,
    joined: bool,
    batch_size: int = 0,
    crops: CropSchedule | None = None,
    sync_bn: bool = False,
) -> tuple[torch.nn.Module, torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """The model on this rank's device (with SyncBatchNorm under `sync_bn`), its DDP wrapper (the model itself on
    one process) and what the step calls (the wrapper, compiled under --compile unless `joined`: Join shadows
    DDP's collectives; compiled once per crop size of `crops` for batches of `batch_size`)."""
    if sync_bn:
        model = sync_batchnorm(model, info.device, info.enabled)
    model = model.to(info.device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    ddp = DistributedDataParallel(model) if info.enabled else model
    if info.device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: pick the fastest kernels once
    if compile_model and joined and info.enabled:
        if info.is_main:
            log.warning("--compile: not applied in split or queue mode across ranks (Join's collectives)")
        return model, ddp, ddp
    if not compile_model:
        return model, ddp, ddp
    return model, ddp, CompiledForward(ddp, batch_size, crop_size_count(crops or CropSchedule(0)), COMPILE_BACKEND)


class TrainStep:
    """The model's training step: `step(images, labels)` updates the weights and returns the loss (no host sync)."""

    def __init__(
        self,
        model: torch.nn.Module,
        forward: Callable[[torch.Tensor], torch.Tensor],
        optimizer: torch.optim.Optimizer,
        criterion: torch.nn.Module,
        amp: torch.dtype | None,
        channels_last: bool,
        clip_grad_norm: float = 0.0,
        batch_transform: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
    ):
        self.model, self.forward, self.optimizer, self.criterion = model, forward, optimizer, criterion
        inner = getattr(forward, "_orig_mod", forward)  # torch.compile's wrapper holds the DDP module here
        self.ddp = inner if isinstance(inner, DistributedDataParallel) else None  # accumulating steps skip its sync
        self.batch_transform = batch_transform  # on the normalised device batch (MixUp/CutMix: soft targets)
        self.amp, self.channels_last, self.clip_grad_norm = amp, channels_last, clip_grad_norm
        device = next(model.parameters()).device
        self.device = device
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)

    def set_lr(self, lr: float) -> None:
        """Set every parameter group's learning rate."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, group: Accumulation = ONE_STEP) -> torch.Tensor:
        """One optimisation step on a uint8 batch, or one part of a gradient-accumulation `group` (the weights
        change after its last part); returns the loss (on the device, float64, detached)."""
        if len(labels) == 1:  # a worker's only sample (damaged data): BatchNorm cannot train on a batch of one
            images, labels = images.expand(2, *images.shape[1:]), labels.expand(2)
        images = normalize(images.to(self.device, non_blocking=True), self.channels_last)
        labels = labels.to(self.device, non_blocking=True)
        if self.batch_transform is not None:
            images, labels = self.batch_transform(images, labels)
        if group.starts:
            self.optimizer.zero_grad(set_to_none=True)
        accumulating = not group.ends and self.ddp is not None
        with self.ddp.no_sync() if accumulating else contextlib.nullcontext():
            with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
                loss = self.criterion(self.forward(images), labels)
            self.scaler.scale(loss / group.size).backward()  # the group's mean loss, as one batch of its size
        if not group.ends:
            return loss.detach().double()
        if self.clip_grad_norm:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the loss-scaled ones
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.detach().double()
