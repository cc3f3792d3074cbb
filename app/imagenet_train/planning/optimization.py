"""The optimiser's arithmetic: which optimizer and LR shape a run names, its warmup in samples seen, the LR at
any point of the run, and the advice for large global batches. No torch, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass

from imagenet_train.choices import AUTO_WARMUP, LrSchedule, Opt, WarmupMethod

GOYAL_BATCH = 8192  # Goyal et al.: 5 warmup epochs at 8K; plain SGD stops scaling above it
GOYAL_WARMUP_EPOCHS = 5.0
SMALL_BATCH_WARMUP_EPOCHS = 1.0


MOMENTUM_OPTS = (Opt.SGD, Opt.LARS)  # the ones --momentum and --nesterov apply to
TIMM_OPTS = (Opt.LAMB, Opt.LARS)  # the ones that need the [timm] extra


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
