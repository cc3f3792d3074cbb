"""The train crop size of each epoch: fixed, or progressive resizing as FFCV does it (a linear ramp from a
start to an end size between two epochs, in multiples of a step: FFCV's 32 by default). Pure arithmetic, shared by the
loader and docs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

STEP = 32  # FFCV rounds the ramp's sizes to multiples of 32 (at ImageNet sizes)


class ResolutionSettings(Protocol):
    """What a CropSchedule reads of a run's augmentation settings (config.AugmentConfig)."""

    train_crop_size: int
    progressive_start_size: int
    progressive_end_size: int
    progressive_start_epoch: int
    progressive_end_epoch: int
    progressive_step: int


@dataclass(frozen=True)
class CropSchedule:
    """Which train crop size each epoch uses: `size` throughout, unless a progressive ramp is set (sizes > 0)."""

    size: int
    start_size: int = 0
    end_size: int = 0
    start_epoch: int = 0
    end_epoch: int = 0
    # Data epochs in one loop epoch (Schedule.interval_epochs): the ramp's epochs are passes over the training
    # set, as the warmup's and the step LR's are, whatever --epoch-batches or --total-samples make a loop epoch.
    epoch_length: float = 1.0
    step: int = STEP  # the ramp's sizes are multiples of this

    @classmethod
    def of(cls, augment: ResolutionSettings, epoch_length: float = 1.0) -> CropSchedule:
        """The schedule a run's augmentation settings describe, for loop epochs of `epoch_length`
        data epochs each."""
        return cls(
            augment.train_crop_size,
            augment.progressive_start_size,
            augment.progressive_end_size,
            augment.progressive_start_epoch,
            augment.progressive_end_epoch,
            epoch_length,
            augment.progressive_step,
        )

    @property
    def progressive(self) -> bool:
        """Whether the size changes over the epochs."""
        return bool(self.start_size and self.end_size)

    def __call__(self, epoch: int) -> int:
        """The train crop size of loop epoch `epoch` (counted from 0), from the data epochs seen at its start."""
        if not self.progressive:
            return self.size
        at = epoch * self.epoch_length
        if at <= self.start_epoch:
            return self.start_size
        if at >= self.end_epoch:
            return self.end_size
        fraction = (at - self.start_epoch) / (self.end_epoch - self.start_epoch)
        size = round((self.start_size + fraction * (self.end_size - self.start_size)) / self.step) * self.step
        # Rounding may step outside the ramp's ends (e.g. to 0 for a ramp from 40 px): stay within them.
        low, high = sorted((self.start_size, self.end_size))
        return min(max(size, low), high)

    def sizes(self, epochs: int) -> list[int]:
        """The crop size of every epoch of a run of `epochs` epochs."""
        return [self(epoch) for epoch in range(epochs)]
