"""Epoch lengths and the learning rate of a run, the same numbers on every rank: the LR's shape and its warmup
in samples seen (`LrCurve`), the LR at any point of the run, the advice for large global batches, and where an
epoch starts on resume (`Schedule.start`). No torch, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple, Protocol

from imagenet_train.choices import AUTO_WARMUP, LrSchedule, Mode, Opt, WarmupMethod
from imagenet_train.planning import plan
from imagenet_train.planning.position import Position
from imagenet_train.planning.resume import EpochStart, epoch_start

GOYAL_BATCH = 8192  # Goyal et al.: 5 warmup epochs at 8K; plain SGD stops scaling above it
GOYAL_WARMUP_EPOCHS = 5.0
SMALL_BATCH_WARMUP_EPOCHS = 1.0


LR_BASE_BATCH = 256  # the global batch --lr is given for (timm's --lr-base-size, Goyal et al.'s 256)
SQRT_SCALED_OPTS = (Opt.ADAMW, Opt.LAMB)  # timm's train.py: 'ada' and 'lamb' optimizers scale by the square root


def scaled_lr(lr: float, opt: Opt | str, global_batch: int) -> float:
    """The peak LR for `global_batch` from --lr given at a batch of 256, as timm's train.py scales --lr-base:
    linearly for SGD and LARS, by the square root of the ratio for the adaptive AdamW and LAMB."""
    ratio = global_batch / LR_BASE_BATCH
    return lr * (math.sqrt(ratio) if Opt(opt) in SQRT_SCALED_OPTS else ratio)


def warmup_epochs(declared: float, global_batch: int) -> float:
    """Epochs of warmup: `declared`, or for -1 (auto) global batch / 1,638.4 epochs, between 1 and 5."""
    if declared != AUTO_WARMUP:
        return declared
    grown = GOYAL_WARMUP_EPOCHS * global_batch / GOYAL_BATCH
    return min(GOYAL_WARMUP_EPOCHS, max(SMALL_BATCH_WARMUP_EPOCHS, grown))


@dataclass(frozen=True)
class LrCurve:
    """The LR over samples seen: a linear warmup to `peak`, then the schedule's shape until `total` samples."""

    schedule: LrSchedule
    peak: float
    warmup: float  # samples seen when the LR reaches its peak
    total: int  # samples seen over the whole run (its steps x the global batch)
    batch: int  # samples per step: the global batch
    end: float = 0.0  # where cosine and poly end
    gamma: float = 0.1  # step: the factor at each drop
    step_every: float = 0.0  # step: samples seen between drops
    warmup_method: WarmupMethod = WarmupMethod.LINEAR
    warmup_start: float = 0.0  # the warmup's start as a fraction of the peak (torchvision's --lr-warmup-decay)

    def at(self, seen: int) -> float:
        """The LR of the step that starts after `seen` samples."""
        if seen < self.warmup:
            if self.warmup_method is WarmupMethod.CONSTANT:
                return self.peak * self.warmup_start
            # Ramps by the samples seen once this step is done, so the first step trains (as in Goyal et al.).
            done = min(1.0, (seen + self.batch) / self.warmup)
            return self.peak * (self.warmup_start + (1.0 - self.warmup_start) * done)
        if self.schedule is LrSchedule.STEP:
            drops = math.floor(seen / self.step_every) if self.step_every > 0 else 0
            return self.peak * self.gamma**drops
        progress = min(1.0, (seen - self.warmup) / max(1.0, self.total - self.warmup))
        if self.schedule is LrSchedule.POLY:
            return self.end + (self.peak - self.end) * (1.0 - progress) ** 2
        if self.schedule is LrSchedule.TRIANGULAR:
            return self.peak * (1.0 - progress)
        return self.end + 0.5 * (self.peak - self.end) * (1.0 + math.cos(math.pi * progress))


def large_batch_advice(opt: Opt | str, global_batch: int, declared_warmup: float) -> str | None:
    """What to change when a global batch above 8,192 trains with plain SGD (None when nothing)."""
    if Opt(opt) is not Opt.SGD or global_batch <= GOYAL_BATCH:
        return None
    warmup = warmup_epochs(declared_warmup, global_batch)
    longer = (
        f"; and a warmup of {GOYAL_WARMUP_EPOCHS:g} epochs (--warmup-epochs -1), not {warmup:g}"
        if warmup < GOYAL_WARMUP_EPOCHS
        else ""
    )
    return (
        f"global batch {global_batch} with plain SGD: above {GOYAL_BATCH} SGD loses accuracy even with "
        f"a long warmup (Goyal et al.); use --opt lars (MLPerf's choice, with --lr-schedule poly){longer}"
    )


def warmup_advice(warmup: float, total: int) -> str | None:
    """A warmup that outlasts the run (in samples seen): the LR never decays (None when it does)."""
    if warmup < total:
        return None
    return (
        f"the warmup ({warmup:.0f} samples) is not shorter than the run ({total} samples): the LR only ever "
        "rises; lower --warmup-epochs or train longer"
    )


class Accumulation(NamedTuple):
    """Where a loader step sits in its gradient-accumulation group."""

    size: int  # loader steps in the group: the loss is divided by it
    starts: bool  # the gradients are cleared before it
    ends: bool  # DDP syncs the gradients and the optimizer steps after it


ONE_STEP = Accumulation(1, True, True)  # no accumulation


class ScheduleLoaderSettings(Protocol):
    """What a Schedule reads of a run's loader settings (config.LoaderConfig)."""

    mode: Mode
    batch_size: int
    workers: int
    epoch_batches: int
    repeat: int
    ra_reps: int


class OptimSettings(Protocol):
    """What a Schedule reads of a run's optimizer settings (config.OptimConfig)."""

    opt: Opt
    lr: float
    warmup_epochs: float
    lr_schedule: LrSchedule
    lr_step_epochs: int
    lr_gamma: float
    lr_end: float
    lr_warmup_method: WarmupMethod
    lr_warmup_decay: float
    grad_accum_steps: int


class RunSettings(Protocol):
    """What a Schedule reads of a run's run settings (config.RunConfig)."""

    seed: int
    epochs: int
    total_samples: int


class Settings(Protocol):
    """A run's settings as a Schedule reads them (config.Config): planning/ never imports config. Read-only
    members, so that config's sections, which hold more than these, satisfy them."""

    @property
    def loader(self) -> ScheduleLoaderSettings:
        """The loader section."""
        ...

    @property
    def optim(self) -> OptimSettings:
        """The optimizer section."""
        ...

    @property
    def run(self) -> RunSettings:
        """The run section."""
        ...


@dataclass(frozen=True)
class Schedule:
    mode: Mode
    train_samples: int
    train_sizes: tuple[int, ...] | None
    batch_size: int  # per rank
    world: int
    workers: int
    epoch_batches_option: int  # --epoch-batches
    repeat: int
    seed: int
    epochs_option: int  # --epochs
    total_samples: int  # --total-samples (0: train by epochs)
    warmup_epochs: float  # as declared: -1 is auto
    base_lr: float
    lr_schedule: LrSchedule = LrSchedule.COSINE
    lr_step_epochs: int = 30
    lr_gamma: float = 0.1
    lr_end: float = 0.0
    opt: Opt = Opt.SGD
    warmup_method: WarmupMethod = WarmupMethod.LINEAR
    warmup_start: float = 0.0  # --lr-warmup-decay
    accumulate: int = 1  # --grad-accum-steps: loader steps per optimizer step
    ra_reps: int = 1  # split mode's plan reads a 1/ra_reps share of the shards, each ra_reps times

    @classmethod
    def of(cls, cfg: Settings, train_samples: int, train_sizes: list[int] | None, world: int) -> Schedule:
        """The schedule of a run; the base LR scales with the optimizer's global batch as timm scales --lr-base
        (scaled_lr)."""
        loader, optim = cfg.loader, cfg.optim
        accumulate = optim.grad_accum_steps
        return cls(
            mode=loader.mode,
            train_samples=train_samples,
            train_sizes=tuple(train_sizes) if train_sizes else None,
            batch_size=loader.batch_size,
            world=world,
            workers=loader.workers,
            epoch_batches_option=loader.epoch_batches,
            repeat=loader.repeat,
            seed=cfg.run.seed,
            epochs_option=cfg.run.epochs,
            total_samples=cfg.run.total_samples,
            warmup_epochs=optim.warmup_epochs,
            base_lr=scaled_lr(optim.lr, optim.opt, loader.batch_size * world * accumulate),
            lr_schedule=LrSchedule(optim.lr_schedule),
            lr_step_epochs=optim.lr_step_epochs,
            lr_gamma=optim.lr_gamma,
            lr_end=optim.lr_end,
            opt=Opt(optim.opt),
            warmup_method=WarmupMethod(optim.lr_warmup_method),
            warmup_start=optim.lr_warmup_decay,
            accumulate=accumulate,
            ra_reps=max(1, loader.ra_reps),
        )

    @property
    def global_batch(self) -> int:
        """Samples per loader step over all ranks (an optimizer step takes --grad-accum-steps of them)."""
        return self.batch_size * self.world

    @property
    def optimizer_batch(self) -> int:
        """Samples per optimizer step over all ranks: what the LR scales with and the warmup grows with."""
        return self.global_batch * self.accumulate

    def accumulation(self, step: int, steps: int) -> Accumulation:
        """Loader step `step` of an epoch of `steps`: its accumulation group (the epoch's last may be shorter, as
        timm's), whether it starts the group and whether the optimizer steps after it."""
        first = step - step % self.accumulate
        size = max(1, min(self.accumulate, steps - first))
        return Accumulation(size, step == first, step + 1 >= first + size)

    def epoch_batches(self, epoch: int) -> int:
        """Steps in one epoch: every rank's in resampled mode, the longest rank's in split/queue mode."""
        if self.total_samples:
            return min(self.interval, self.total - epoch * self.interval)
        if self.mode == Mode.RESAMPLED:
            return self.epoch_batches_option or plan.resampled_epoch_batches(
                self.train_samples, self.batch_size, self.world
            )
        if self.train_sizes is None:
            # No shard sizes: an even share, plus a partial batch per worker.
            return max(1, math.ceil(self.train_samples / self.global_batch)) + (self.workers or 1)
        queue = self.mode == Mode.QUEUE  # ranks take what they can: counted at an equal pace, every shard once
        setup = plan.Setup(
            tuple(self.train_sizes),
            gpus_per_node=self.world,
            workers=self.workers,
            batch_size=self.batch_size,
            mode=Mode.QUEUE if queue else Mode.SPLIT,
            epoch_batches=0 if queue else self.epoch_batches_option,
            repeat=1 if queue else self.repeat,
            seed=self.seed,
            epoch=epoch,
            ra_reps=max(1, self.ra_reps),
        )
        return max(r.batches for r in plan.rank_plans(setup))

    def known_batches(self, epoch: int) -> int | None:
        """The batches this rank runs in `epoch` when they are known before it starts; None in queue mode, where
        a rank's count follows the shards its workers claim at run time (a faster rank claims more)."""
        return None if self.mode == Mode.QUEUE else self.epoch_batches(epoch)

    @cached_property
    def interval(self) -> int:
        """Batches per rank in a full epoch, or in one interval of a --total-samples run."""
        if not self.total_samples:
            return self.epoch_batches(0)
        return self.epoch_batches_option or plan.resampled_epoch_batches(
            self.train_samples, self.batch_size, self.world
        )

    @cached_property
    def total(self) -> int:
        """Optimizer steps of the whole run: the length of the LR schedule."""
        if self.total_samples:
            return max(1, self.total_samples // self.global_batch)
        return self.epochs_option * self.interval

    @cached_property
    def epochs(self) -> int:
        """Epochs to run; with --total-samples, intervals of --epoch-batches (the last one shorter)."""
        return math.ceil(self.total / self.interval) if self.total_samples else self.epochs_option

    @property
    def cut(self) -> bool:
        """Whether a loop epoch is other than one pass over the data: --total-samples, or --epoch-batches outside
        queue mode (which reads every shard once per epoch whatever it says)."""
        return bool(self.total_samples or (self.epoch_batches_option and self.mode != Mode.QUEUE))

    @cached_property
    def interval_epochs(self) -> float:
        """Data epochs (passes over the training set) in one loop epoch: 1, unless --epoch-batches or
        --total-samples give the loop's epochs another length (samples per interval / training samples)."""
        return self.interval * self.global_batch / self.train_samples if self.cut else 1.0

    @cached_property
    def data_epochs(self) -> float:
        """The run's length in data epochs (samples seen / training samples), the epochs torchvision's EMA decay
        and FFCV's resizing ramp count; --epochs itself unless --epoch-batches or --total-samples say otherwise."""
        return self.total * self.global_batch / self.train_samples if self.cut else float(self.epochs_option)

    @property
    def warmup(self) -> float:
        """Epochs of warmup, with -1 (auto) resolved for the global batch."""
        return warmup_epochs(self.warmup_epochs, self.optimizer_batch)

    def facts(self) -> dict[str, float]:
        """What a checkpoint records of the schedule it was taken under."""
        return {"base_lr": self.base_lr, "epochs": self.epochs, "total_batches": self.total}

    @property
    def warmup_steps(self) -> int:
        """Optimizer steps until the warmup's samples are seen (what an EMA copies through)."""
        return math.ceil(self.warmup * self.train_samples / self.global_batch)

    @cached_property
    def curve(self) -> LrCurve:
        """The LR over samples seen; an epoch here is the training set's samples, whatever --epoch-batches says."""
        return LrCurve(
            self.lr_schedule,
            self.base_lr,
            warmup=self.warmup * self.train_samples,
            total=self.total * self.global_batch,
            batch=self.optimizer_batch,
            end=self.lr_end,
            gamma=self.lr_gamma,
            step_every=self.lr_step_epochs * self.train_samples,
            warmup_method=self.warmup_method,
            warmup_start=self.warmup_start,
        )

    def lr(self, epoch: int, step: int, steps: int) -> float:
        """The LR of a step: warmup, then --lr-schedule, at the samples seen (global steps x global batch) when
        its optimizer step's accumulation group began."""
        step = min(step, steps - 1)
        global_step = epoch * self.interval + step - step % self.accumulate
        return self.curve.at(global_step * self.global_batch)

    def advice(self) -> list[str]:
        """Pre-flight advice on the optimisation: plain SGD at a large global batch, a warmup as long as the run."""
        found = [
            large_batch_advice(self.opt, self.optimizer_batch, self.warmup_epochs),
            warmup_advice(self.curve.warmup, self.curve.total),
        ]
        return [line for line in found if line]

    @property
    def exact(self) -> bool:
        """Every sample once per epoch (split and queue modes): ranks may get uneven batch counts, under Join."""
        return self.mode in (Mode.SPLIT, Mode.QUEUE)

    def start(self, saved: Position | None, epoch: int) -> EpochStart:
        """Where `epoch` starts on this schedule's ranks, from the position a checkpoint saved (if any)."""
        steps = self.epoch_batches(epoch)
        return epoch_start(saved, epoch, self.mode, self.world, self.batch_size, steps, self.epoch_batches_option)
