"""One epoch's running totals on one rank (loss, samples, steps, the damage the loader met, the data wait) and
the epoch's record summed over every rank when it ends."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from imagenet_train.training.data_wait import DataWait
from imagenet_train.training.dist import DistInfo, all_gather_numbers, all_sum


@dataclass
class EpochTally:
    """Totals of the epoch so far; `step` counts from the epoch's start, so a resumed epoch starts above 0."""

    start: int  # the step the epoch (or its resumed part) started at
    damage_before: tuple[int, int, int]  # the loader's (corrupt, broken, lost) counts when the epoch started
    loss_sum: torch.Tensor  # on the device: summed without a host sync per step
    lr: float
    step: int = 0
    samples: int = 0
    wait: DataWait = field(default_factory=DataWait)

    def __post_init__(self) -> None:
        self.step = self.start

    def add(self, loss: torch.Tensor, samples: int) -> None:
        """Count one step's mean loss over `samples` samples."""
        self.loss_sum += loss * samples
        self.samples += samples
        self.step += 1

    def record(self, damage_now: tuple[int, int, int], info: DistInfo) -> dict:
        """The epoch's record over all ranks (a collective: every rank calls it)."""
        damage = [now - before for now, before in zip(damage_now, self.damage_before, strict=True)]
        loss, total, corrupt, broken, lost = all_sum([self.loss_sum.item(), self.samples, *damage], info)
        per_rank = [int(b[0]) - self.start for b in all_gather_numbers([self.step], info)]
        waits = [round(w[0], 4) for w in all_gather_numbers([self.wait.fraction], info)]
        return {
            **({"resumed_from_step": self.start} if self.start else {}),
            "lr": self.lr,
            "train_loss": loss / max(total, 1),
            "train_samples": int(total),
            "batches_per_rank": per_rank,
            "data_wait_fraction": round(sum(waits) / len(waits), 4),
            "data_wait_per_rank": waits,
            "corrupt_samples": int(corrupt),
            "broken_shards": int(broken),
            "lost_samples": int(lost),
        }
