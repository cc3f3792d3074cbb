"""What the training loop calls around each step, besides the step itself: the position key log, the keys
read (--log-keys), the mid-epoch checkpoint and the pre-emption vote. A recipe's per-step extra (an EMA) is
one more hook; the loop reads the same with or without any of them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch.distributed.algorithms.join import Join

from imagenet_train.rundir.key_log import KeyLog, encode_key
from imagenet_train.training.preempt import StepVote, Verdict
from imagenet_train.training.replicas import sync_optimizer_state


class StepHook:
    """A hook of the training loop; each method does nothing unless a hook overrides it."""

    def before_step(self, step: int, keys: list[str]) -> None:
        """Called with the batch about to be trained on (its index in the epoch and its sample keys)."""

    def after_step(self, step: int) -> bool:
        """Called after the step; True ends the epoch here (every rank must agree: only the vote says so)."""
        return False

    def end(self) -> None:
        """Called once when the epoch's loop is left, however it was left."""


class PositionLog(StepHook):
    """Exact modes: each batch's keys are logged before its step, so a mid-epoch resume can skip them."""

    def __init__(self, run_dir: Path, epoch: int, rank: int, start: int, vote: StepVote):
        self.log, self.vote = KeyLog(run_dir, epoch, rank, start), vote

    def before_step(self, step: int, keys: list[str]) -> None:
        """Log the batch's keys (a failed write stops every rank at the next vote)."""
        self.vote.guard(self.log.fetched, step, keys)

    def end(self) -> None:
        """Close the epoch's log."""
        self.log.close()


class KeysRead(StepHook):
    """--log-keys: every key this rank trained on, written under RUN_DIR/keys when the epoch ends."""

    def __init__(self, run_dir: Path, epoch: int, rank: int, append: bool):
        self.run_dir, self.epoch, self.rank, self.append = run_dir, epoch, rank, append
        self.keys: list[str] = []

    def before_step(self, step: int, keys: list[str]) -> None:
        """Keep the batch's keys."""
        self.keys.extend(keys)

    def end(self) -> None:
        """Write the epoch's keys (a resumed part of an epoch appends)."""
        write_keys(self.run_dir, "train", self.epoch, self.rank, self.keys, self.append)


def write_keys(run_dir: Path, split: str, epoch: int, rank: int, keys: list[str], append: bool = False) -> None:
    """Write the keys `rank` read of `split` in `epoch` to RUN_DIR/keys (the --log-keys debug record), one a line,
    percent-encoded as the key log writes them (a tar member name may hold a newline or undecodable bytes)."""
    folder = Path(run_dir) / "keys"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{split}-epoch{epoch:04d}-rank{rank}.txt", "a" if append else "w", encoding="ascii") as stream:
        stream.write("".join(encode_key(key) + "\n" for key in keys))


class MidEpochCheckpoint(StepHook):
    """--checkpoint-every N: rank 0 checkpoints after every Nth step of the epoch (not after its last)."""

    def __init__(self, every: int, steps: int, write: Callable[[int], object], vote: StepVote):
        self.every, self.steps, self.write, self.vote = every, steps, write, vote

    def after_step(self, step: int) -> bool:
        """Checkpoint after `step` steps when due (a failed write stops every rank at the next vote)."""
        if self.every and step % self.every == 0 and step < self.steps:
            self.vote.guard(self.write, step)
        return False


class StopVote(StepHook):
    """The per-step vote on a pre-emption signal or a rank's failure: every rank leaves at the same step. With
    `joined` (exact modes on several ranks, whose batch counts differ) the DDP model and the vote run under Join,
    so ranks out of data keep voting in the shadow loop, and the optimizer state is evened out after the epoch."""

    def __init__(
        self,
        vote: StepVote,
        joined: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        averaged: torch.nn.Module | None = None,
    ):
        self.vote, self.joined, self.optimizer, self.averaged = vote, joined, optimizer, averaged

    def joining(self) -> contextlib.AbstractContextManager:
        """The epoch's Join over the DDP model and the vote (nothing without `joined`)."""
        return Join([self.joined, self.vote]) if self.joined is not None else contextlib.nullcontext()

    def after_step(self, step: int) -> bool:
        """Vote; True when the ranks agreed to stop."""
        return bool(self.vote.cast())

    def settle(self, stopped: bool, step: int) -> tuple[Verdict, int | None]:
        """After the epoch's loop, every rank's final word (a rank's failure is raised here) and the steps taken
        when the ranks stopped inside the epoch (None when it ran to its end)."""
        verdict, (stopped_mid_epoch, steps_taken) = self.vote.settle(int(stopped), step)
        self.vote.raise_failure(verdict)
        if self.joined is not None:
            sync_optimizer_state(self.optimizer, step, self.vote.info, self.averaged)
        return verdict, steps_taken if stopped_mid_epoch else None
