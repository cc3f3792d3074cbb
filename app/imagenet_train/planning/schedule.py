"""Epoch lengths and the learning rate of a run: the same numbers on every rank, no torch, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from imagenet_train.planning import plan


@dataclass(frozen=True)
class Schedule:
    mode: str
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
    warmup_epochs: float
    base_lr: float

    @classmethod
    def of(cls, cfg: Any, train_samples: int, train_sizes: list[int] | None, world: int) -> Schedule:
        """The schedule of a run; the base LR scales linearly with the global batch (per 256).

        `cfg` is the run's Config (its data, optim and run sections), read by name so that planning/ never
        imports config."""
        data = cfg.data
        return cls(
            mode=data.mode,
            train_samples=train_samples,
            train_sizes=tuple(train_sizes) if train_sizes else None,
            batch_size=data.batch_size,
            world=world,
            workers=data.workers,
            epoch_batches_option=data.epoch_batches,
            repeat=data.repeat,
            seed=cfg.run.seed,
            epochs_option=cfg.run.epochs,
            total_samples=cfg.run.total_samples,
            warmup_epochs=cfg.optim.warmup_epochs,
            base_lr=cfg.optim.lr * data.batch_size * world / 256,
        )

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world

    def epoch_batches(self, epoch: int) -> int:
        """Steps in one epoch: every rank's in resampled mode, the longest rank's in split/queue mode."""
        if self.total_samples:
            return min(self.interval, self.total - epoch * self.interval)
        if self.mode == plan.Mode.RESAMPLED:
            return self.epoch_batches_option or plan.resampled_epoch_batches(
                self.train_samples, self.batch_size, self.world
            )
        if self.train_sizes is None or self.mode == plan.Mode.QUEUE:
            # Queue mode: ranks take what they can; an even share (plus a partial batch per worker).
            return max(1, math.ceil(self.train_samples / self.global_batch)) + (self.workers or 1)
        setup = plan.Setup.of(
            self,
            self.seed,
            self.train_sizes,
            gpus_per_node=self.world,
            mode=plan.Mode.SPLIT,
            epoch_batches=self.epoch_batches_option,
            epoch=epoch,
        )
        return max(r.batches for r in plan.rank_plans(setup))

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

    def lr(self, epoch: int, step: int, steps: int) -> float:
        """Warmup then cosine over the run's global steps."""
        warmup = round(self.warmup_epochs * self.interval)
        return plan.lr_at(epoch * self.interval + min(step, steps - 1), self.total, warmup, self.base_lr)
