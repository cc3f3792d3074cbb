"""The training step of a run: the model as each rank trains it (on the device, under DDP, compiled), what it
optimises with (the optimizer over its weight-decay groups, the loss, MixUp/CutMix, the EMA: `build`), and one
optimisation step on a device batch: normalise, transform the batch, forward under autocast, scaled backward,
clip, step.

--model-ema: an exponential moving average of the weights (torch's AveragedModel, BN buffers included), updated
by a step hook, saved in every checkpoint and evaluated beside the model (the final weights are whichever of the
two scored the better top-1: evaluation.write_final)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from imagenet_train.choices import Amp, CompileMode, Loss
from imagenet_train.compat import ensure_torchvision, require_timm
from imagenet_train.config import Config, OptimConfig
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.planning.resolution import CropSchedule
from imagenet_train.planning.schedule import ONE_STEP, Accumulation, Schedule
from imagenet_train.planning.seeds import augmentation_seed
from imagenet_train.training import models
from imagenet_train.training.batch_input import normalize
from imagenet_train.training.dist import DistInfo
from imagenet_train.training.hooks import StepHook
from imagenet_train.training.optimizers import build_optimizer, keep_kernels

log = logging.getLogger(__name__)

COMPILE_BACKEND: str | Callable = "inductor"  # torch.compile's backend for --compile (tests count with others)
PREFIX = "ema_"  # of the EMA's evaluation keys in the epoch record: ema_top1, ema_top5, ema_val_loss


def update_decay(decay: float, optimizer_batch: int, every: int, epochs: float) -> float:
    """The decay per EMA update for `decay` given per sample-epoch, as torchvision's reference adjusts it:
    1 - min(1, (1 - decay) x samples per update / epochs), where an update comes every `every` optimizer steps of
    `optimizer_batch` samples (over all ranks, --grad-accum-steps included) and `epochs` are data epochs (passes
    over the training set): the average then spans epochs / ((1 - decay) x training samples) of them."""
    return 1.0 - min(1.0, (1.0 - decay) * optimizer_batch * every / epochs)


class ModelEma(StepHook):
    """The EMA of a model's weights and buffers, updated after every `every`th optimizer step (timm's, one per
    optimizer step with gradient accumulation); during the first `warmup` loader steps of the run (the LR warmup)
    each update copies the weights instead of averaging them.

    One object serves the whole run: `at(first_step, steps)` tells it where the coming epoch starts in the run and
    how many loader steps it has, so it knows which steps end an accumulation group (Schedule.accumulation's)."""

    def __init__(self, model: torch.nn.Module, decay: float, every: int, warmup: int, accumulate: int = 1):
        self.model, self.every, self.warmup, self.accumulate = model, every, warmup, accumulate
        self.averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
        self.averaged.eval()
        self.offset = 0  # the run's step at the start of the current epoch
        self.steps = 0  # loader steps in the current epoch (0: not known; groups then end every `accumulate`)

    @property
    def module(self) -> torch.nn.Module:
        """The averaged copy of the model, for evaluation and the final weights."""
        return self.averaged.module

    def at(self, first_step: int, steps: int = 0) -> ModelEma:
        """This hook for an epoch of `steps` loader steps whose step 0 is the run's step `first_step`."""
        self.offset, self.steps = first_step, steps
        return self

    def after_step(self, step: int) -> bool:
        """Update the average after every `every`th optimizer step of the epoch; `step` loader steps are done."""
        ends_group = step % self.accumulate == 0 or step == self.steps  # an epoch's last group may be shorter
        if ends_group and -(-step // self.accumulate) % self.every == 0:
            self.averaged.update_parameters(self.model)
            if self.offset + step <= self.warmup:
                self.averaged.n_averaged.zero_()  # the next update copies again
        return False

    def state_dict(self) -> dict:
        """The averaged weights and buffers, and the number of updates averaged (for an exact resume)."""
        return self.averaged.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint's EMA."""
        self.averaged.load_state_dict(state)


def run_ema(model: torch.nn.Module, optim: OptimConfig, schedule: Schedule) -> ModelEma | None:
    """A run's EMA under --model-ema (None without): the decay per update adjusted for the run's optimizer batch and
    length in data epochs (not loop epochs: --epoch-batches and --total-samples change those), copying during the
    LR warmup (its steps as Schedule.lr counts them)."""
    if not optim.model_ema:
        return None
    decay = update_decay(optim.model_ema_decay, schedule.optimizer_batch, optim.model_ema_steps, schedule.data_epochs)
    return ModelEma(model, decay, optim.model_ema_steps, schedule.warmup_steps, schedule.accumulate)


def ema_scores(record: dict) -> dict:
    """An evaluation record's scores under the EMA's keys (ema_top1, ema_top5, ema_val_loss)."""
    return {PREFIX + key: value for key, value in record.items() if key == "val_loss" or key.startswith("top")}


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

    def __init__(
        self,
        module: torch.nn.Module,
        batch_size: int,
        sizes: int,
        backend: str | Callable = "inductor",
        mode: CompileMode = CompileMode.DEFAULT,
    ):
        self.module, self.batch_size = module, batch_size
        # torch's modes are inductor's: another backend (the tests' counting one) takes none.
        named = str(mode) if backend == "inductor" and mode != CompileMode.DEFAULT else None
        self.compiled = torch.compile(module, dynamic=False, backend=backend, mode=named)
        self.cuda_graphs = mode.cuda_graphs and backend == "inductor"
        # Compiled graphs are cached per code object up to this limit (8 by default); past it torch silently
        # runs the model uncompiled. One entry per crop size, and one spare for a change of grad mode.
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, sizes + 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """The module's output; compiled for a full batch."""
        if len(images) != self.batch_size:
            return self.module(images)
        if self.cuda_graphs:
            # Each call is a new step: the graph's outputs of the last one may be overwritten (the step keeps none).
            torch.compiler.cudagraph_mark_step_begin()
        return self.compiled(images)


def distribute(
    model: torch.nn.Module,
    info: DistInfo,
    channels_last: bool,
    compile_model: bool,
    joined: bool,
    batch_size: int = 0,
    crops: CropSchedule | None = None,
    sync_bn: bool = False,
    compile_mode: CompileMode = CompileMode.DEFAULT,
) -> tuple[torch.nn.Module, torch.nn.Module, Callable[[torch.Tensor], torch.Tensor]]:
    """The model on this rank's device (with SyncBatchNorm under `sync_bn`), its DDP wrapper (the model itself on
    one process) and what the step calls (the wrapper, compiled under --compile unless `joined`: Join shadows
    DDP's collectives; compiled once per crop size of `crops` for batches of `batch_size`)."""
    if sync_bn:
        model = sync_batchnorm(model, info.device, info.enabled)
    model = model.to(info.device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # missing in torch's stubs
    ddp = DistributedDataParallel(model) if info.enabled else model
    if info.device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: pick the fastest kernels once
    if compile_model and joined and info.enabled:
        if info.is_main:
            log.warning("--compile: not applied in split or queue mode across ranks (Join's collectives)")
        return model, ddp, ddp
    if not compile_model:
        return model, ddp, ddp
    sizes = crop_size_count(crops or CropSchedule(0))
    return model, ddp, CompiledForward(ddp, batch_size, sizes, COMPILE_BACKEND, CompileMode(compile_mode))


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
        wrapper: torch.nn.Module | None = None,
        ema: ModelEma | None = None,
    ):
        self.model, self.forward, self.optimizer, self.criterion = model, forward, optimizer, criterion
        self.wrapper = wrapper or model  # what trains: DDP's wrapper, or the model itself on one process
        self.ema = ema  # --model-ema's average of the weights (a step hook updates it), or None
        # Accumulating steps skip DDP's gradient sync; the wrapper is DDP's (also when `forward` is compiled).
        self.ddp = self.wrapper if isinstance(self.wrapper, DistributedDataParallel) else None
        self.batch_transform = batch_transform  # on the normalised device batch (MixUp/CutMix: soft targets)
        self.amp, self.channels_last, self.clip_grad_norm = amp, channels_last, clip_grad_norm
        device = next(model.parameters()).device
        self.device = device
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)

    def keep_kernels(self, fused: bool) -> None:
        """After a checkpoint's optimizer state is loaded: this run's --fused-optimizer, not the checkpoint's."""
        keep_kernels(self.optimizer, fused)

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, group: Accumulation = ONE_STEP, lr: float | None = None
    ) -> torch.Tensor:
        """One optimisation step on a uint8 batch at learning rate `lr` (every parameter group's; None keeps it),
        or one part of a gradient-accumulation `group` (the weights change after its last part); returns the loss
        (on the device, float64, detached)."""
        if lr is not None:
            for param_group in self.optimizer.param_groups:
                param_group["lr"] = lr
        if len(labels) == 1:  # a worker's only sample (damaged data): BatchNorm cannot train on a batch of one
            images, labels = images.expand(2, *images.shape[1:]), labels.expand(2)
        images = normalize(images.to(self.device, non_blocking=True), self.channels_last)
        labels = labels.to(self.device, non_blocking=True)
        if self.batch_transform is not None:
            images, labels = self.batch_transform(images, labels)
        if group.starts:
            self.optimizer.zero_grad(set_to_none=True)
        accumulating = self.ddp.no_sync() if not group.ends and self.ddp is not None else None
        with accumulating or contextlib.nullcontext():
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


def build_criterion(optim_cfg: OptimConfig) -> torch.nn.Module:
    """The --loss criterion with --label-smoothing (and --bce-target-threshold)."""
    if Loss(optim_cfg.loss) is Loss.CE:
        return torch.nn.CrossEntropyLoss(label_smoothing=optim_cfg.label_smoothing)
    require_timm("--loss bce")
    from timm.loss import BinaryCrossEntropy

    # timm smooths hard labels here; soft targets (MixUp/CutMix) are taken as they are, which in timm's train.py
    # are smoothed by its own Mixup (torchvision's MixUp/CutMix, used here, do not smooth).
    threshold = optim_cfg.bce_target_threshold or None
    return BinaryCrossEntropy(smoothing=optim_cfg.label_smoothing, target_threshold=threshold)


BatchTransform = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def batch_mixing(mixup_alpha: float, cutmix_alpha: float, num_classes: int) -> BatchTransform | None:
    """The batch transform for the given alphas (0 turns one off), or None when both are off."""
    ensure_torchvision()
    from torchvision.transforms import v2

    chosen = []
    if mixup_alpha > 0:
        chosen.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
    if cutmix_alpha > 0:
        chosen.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
    if not chosen:
        return None
    return chosen[0] if len(chosen) == 1 else v2.RandomChoice(chosen)


def build(cfg: Config, info: DistInfo, num_classes: int, schedule: Schedule) -> TrainStep:
    """The run's training step on this rank: its model (the same initial weights on every rank) on the device as
    the run's settings wrap it, the optimizer at the schedule's base LR, the loss, MixUp/CutMix and the EMA."""
    augment, optim, run = cfg.augment, cfg.optim, cfg.run
    torch.manual_seed(run.seed)  # identical initial weights on every rank
    channels_last = run.channels_last and info.device.type == "cuda"
    model = models.create(run, num_classes, info.is_main)
    crops = CropSchedule.of(augment)
    model, ddp, forward = distribute(
        model,
        info,
        channels_last,
        run.compile,
        schedule.exact,
        cfg.loader.batch_size,
        crops,
        run.sync_bn,
        run.compile_mode,
    )
    optimizer = build_optimizer(optim, model, schedule.base_lr)
    return TrainStep(
        model,
        forward,
        optimizer,
        build_criterion(optim),
        amp_dtype(run.amp, info.device),
        channels_last,
        optim.clip_grad_norm,
        batch_mixing(augment.mixup_alpha, augment.cutmix_alpha, num_classes),
        wrapper=ddp,
        ema=run_ema(model, optim, schedule),
    )


def seed_augmentation(seed: int, rank: int) -> None:
    """Seed this process's torch RNG for `rank`'s augmentation (in-process, and the DataLoader workers' seeds).

    Call it after the model is built from the shared seed: every rank must start with the same weights but
    crop differently, or both halves of each global batch get the same crops.
    """
    torch.manual_seed(augmentation_seed(seed, rank))
