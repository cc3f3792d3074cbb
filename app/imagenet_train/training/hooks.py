"""What the training loop calls around each step, besides the step itself: the position key log, the keys
read (--log-keys), the mid-epoch checkpoint and the pre-emption vote (`StopVote`, which also owns DDP's Join and
the optimizer-state sync after it). A recipe's per-step extra (an EMA) is one more hook; the loop reads the same
with or without any of them.

The vote: a stop signal (SIGTERM/SIGUSR1) reaches the ranks at different steps, so every step the ranks agree
whether any of them was asked to stop (`StepVote`), and leave together at the same step; a rank still waiting for
a batch when the signal comes leaves its wait (`stop_waiting`). After Join, the replicas' optimizer states are made
equal again (`sync_optimizer_state`) and checked (`replicas_in_sync`)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from imagenet_train import waiting
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.training.dist import DistInfo, all_gather_numbers


class StepHook:
    """A hook of the training loop; each method does nothing unless a hook overrides it."""

    def before_step(self, step: int, keys: list[str]) -> None:
        """Called with the batch about to be trained on (its index in the epoch and its sample keys)."""

    def after_step(self, step: int) -> bool:
        """Called after the step; True ends the epoch here (every rank must agree: only the vote says so)."""
        return False

    def end(self) -> None:
        """Called once when the epoch's loop is left, however it was left."""


class KeyLogFile(Protocol):
    """The epoch's key log in the run directory (`RunDirectory.key_log`)."""

    def fetched(self, index: int, keys: list[str]) -> None:
        """Log batch `index`'s keys before its step."""

    def close(self) -> None:
        """Close the log."""


class PositionLog(StepHook):
    """Exact modes: each batch's keys are logged before its step, so a mid-epoch resume can skip them."""

    def __init__(self, log: KeyLogFile, vote: StepVote):
        self.log, self.vote = log, vote

    def before_step(self, step: int, keys: list[str]) -> None:
        """Log the batch's keys (a failed write stops every rank at the next vote)."""
        self.vote.guard(self.log.fetched, step, keys)

    def end(self) -> None:
        """Close the epoch's log."""
        self.log.close()


class KeysRead(StepHook):
    """--log-keys: every key this rank trained on, handed to `write` (RUN_DIR/keys) when the epoch ends."""

    def __init__(self, write: Callable[[list[str]], None]):
        self.write = write  # the epoch's keys file of this rank (a resumed part of an epoch appends)
        self.keys: list[str] = []

    def before_step(self, step: int, keys: list[str]) -> None:
        """Keep the batch's keys."""
        self.keys.extend(keys)

    def end(self) -> None:
        """Write the epoch's keys."""
        self.write(self.keys)


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
        joined: Joinable | None = None,
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

    def settle(self, stopped: bool, step: int) -> tuple[StopVerdict, int | None]:
        """After the epoch's loop, every rank's final word (a rank's failure is raised here) and the steps taken
        when the ranks stopped inside the epoch (None when it ran to its end)."""
        verdict, (stopped_mid_epoch, steps_taken) = self.vote.settle(int(stopped), step)
        self.vote.raise_failure(verdict)
        if self.joined is not None and self.optimizer is not None:
            sync_optimizer_state(self.optimizer, step, self.vote.info, self.averaged)
        return verdict, steps_taken if stopped_mid_epoch else None


Stopping = waiting.Stopping

# How long a rank that a stop signal took out of its wait for data waits for the others to say they stopped at the
# same step (in the job's store): all of them did, and they save as at a step boundary; otherwise it leaves without.
AGREE_S = 2.0


def stop_waiting(stop: waiting.Stopping, info: DistInfo, epoch: int, step: int, since: int) -> bool:
    """A stop signal ended this rank's wait for its next batch at `step`: True when a step was taken since the
    last checkpoint (`since`) and every rank stopped waiting at the same step, so they can save; else re-raise
    `stop` with the reason there will be no checkpoint."""
    if step <= since:
        stop.reason = "no step since the last checkpoint"
        raise stop
    if not _stopped_together(info, epoch, step):
        stop.reason = (
            f"the other ranks did not stop waiting within {AGREE_S:.0f} s at step {step} (in a collective or gone)"
        )
        raise stop
    return True


@contextlib.contextmanager
def unsaved_on_stop(reason: str) -> Iterator[None]:
    """A stop signal in a wait inside this block leaves the rank without a checkpoint, for `reason`."""
    try:
        yield
    except Stopping as stop:
        stop.reason = stop.reason or reason
        raise


def _stopped_together(info: DistInfo, epoch: int, step: int) -> bool:
    """Every rank says where it stopped through the job's store (no collective: a peer may be inside one)."""
    if not info.enabled:
        return True
    store = dist.distributed_c10d._get_default_store()
    prefix = f"imagenet-train/stopped-waiting/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    here = f"{epoch}:{step}"
    try:
        store.set(f"{prefix}/{info.rank}", here)
        keys = [f"{prefix}/{rank}" for rank in range(info.world)]
        ends = time.monotonic() + AGREE_S
        while not store.check(keys):  # polled: the store's own wait logs its timeout as a warning
            if time.monotonic() > ends:
                return False
            time.sleep(0.05)
        return all(store.get(key) == here.encode() for key in keys)
    except Exception:  # the store's timeout is a RuntimeError or DistStoreError, its loss a DistNetworkError
        return False


class StopRequest:
    """The stop signal this rank received, if any: noted by `waiting`'s handler (which also ends any wait),
    acted on at a step boundary."""

    def __init__(self) -> None:
        self._signum = 0

    @property
    def signum(self) -> int:
        """The stop signal received (0: none)."""
        return self._signum or waiting.requested()

    @signum.setter
    def signum(self, value: int) -> None:
        self._signum = value

    def install(self) -> None:
        """Note SIGTERM and SIGUSR1 from now on (in the main thread only; see imagenet_train.waiting)."""
        waiting.install()


@dataclass(frozen=True)
class StopVerdict:
    """What the ranks' per-step vote decided: a stop signal some rank received, or a rank that failed."""

    signum: int  # the stop signal some rank received (0: none)
    failed_rank: int  # 1 + the first rank that failed (0: none)

    def __bool__(self) -> bool:
        return bool(self.signum or self.failed_rank)


class _Slot:
    """One vote in flight: host input, device tensor, host output and the event marking its arrival."""

    def __init__(self, device: torch.device):
        pinned = device.type == "cuda"
        self.host_in = torch.zeros(2, dtype=torch.int64, pin_memory=pinned)
        self.device = torch.zeros(2, dtype=torch.int64, device=device)
        self.host_out = torch.zeros(2, dtype=torch.int64, pin_memory=pinned)
        self.event = torch.cuda.Event() if pinned else None


class StepVote(Joinable):
    """The per-step agreement on whether to stop (see the module docstring)."""

    def __init__(self, request: StopRequest, info: DistInfo):
        super().__init__()
        self.request, self.info = request, info
        self.failure: BaseException | None = None
        self.lag = 2 if info.device.type == "cuda" else 0
        self.slots = [_Slot(info.device) for _ in range(self.lag + 1)]
        self.cast_count = 0

    def fail(self, error: BaseException) -> None:
        """Note this rank's failure; every rank stops at the next vote and the error is raised then."""
        self.failure = self.failure or error

    def guard(self, action: Callable[..., object], *args: object) -> None:
        """Run a rank-local write; a failure stops every rank at the next vote instead of leaving them waiting."""
        try:
            action(*args)
        except (ImagenetTrainError, OSError) as error:
            self.fail(error if isinstance(error, ImagenetTrainError) else ImagenetTrainError(f"{error}"))

    def _local(self) -> tuple[int, int]:
        return self.request.signum, (self.info.rank + 1) if self.failure else 0

    def _issue(self) -> _Slot:
        slot = self.slots[self.cast_count % len(self.slots)]
        self.cast_count += 1
        slot.host_in[0], slot.host_in[1] = self._local()
        if not self.info.enabled:
            slot.host_out.copy_(slot.host_in)
            return slot
        slot.device.copy_(slot.host_in, non_blocking=True)
        dist.all_reduce(slot.device, op=dist.ReduceOp.MAX)
        slot.host_out.copy_(slot.device, non_blocking=True)
        if slot.event is not None:
            slot.event.record()
        return slot

    def cast(self) -> StopVerdict:
        """Vote for this step; the verdict of the step `lag` votes ago (identical on every rank)."""
        self._issue()
        if self.cast_count <= self.lag:
            return StopVerdict(0, 0)
        slot = self.slots[(self.cast_count - 1 - self.lag) % len(self.slots)]
        if slot.event is not None:
            slot.event.synchronize()  # recorded `lag` steps ago: long done, no wait in practice
        return StopVerdict(int(slot.host_out[0]), int(slot.host_out[1]))

    def settle(self, *numbers: int) -> tuple[StopVerdict, list[int]]:
        """Outside any Join: every rank's final word plus the maxima of `numbers` (e.g. steps taken)."""
        values = torch.tensor([*self._local(), *numbers], dtype=torch.int64)
        if self.info.enabled:
            values = values.to(self.info.device)
            dist.all_reduce(values, op=dist.ReduceOp.MAX)
        result = values.tolist()
        self.cast_count = 0  # a new loop starts its own lag
        return StopVerdict(result[0], result[1]), result[2:]

    def raise_failure(self, verdict: StopVerdict) -> None:
        """Every rank raises: the failed rank its own error, the others one that names it."""
        if not verdict.failed_rank:
            return
        if self.failure is not None:
            raise self.failure
        raise ImagenetTrainError(f"stopped because rank {verdict.failed_rank - 1} failed (its error is in its log)")

    # -- Joinable: ranks that ran out of data keep voting while the others finish ----------------------------
    def join_hook(self, **kwargs) -> JoinHook:
        """The hook that keeps a rank which ran out of data voting while the others finish."""
        vote = self

        class _Shadow(JoinHook):
            def main_hook(self) -> None:
                vote._issue()

        return _Shadow()

    @property
    def join_device(self) -> torch.device:
        """The device the votes are reduced on."""
        return self.info.device

    @property
    def join_process_group(self):
        """The process group the votes go through: the default one."""
        return dist.distributed_c10d._get_default_group()


def sync_optimizer_state(
    optimizer: torch.optim.Optimizer, batches: int, info: DistInfo, ema: torch.nn.Module | None = None
) -> None:
    """After Join, copy momentum, and the EMA when there is one, from a rank that ran every step (`batches`:
    this rank's steps).

    Join's DDP hook syncs the parameters from the last joiner; optimizer state on ranks that
    joined early is stale and would make the replicas drift apart from the next step on. Their EMA
    missed the updates of the steps they sat out: without the copy each rank would evaluate its
    own average (ema_top1) while rank 0's alone is saved.
    """
    counts = [int(c[0]) for c in all_gather_numbers([batches], info)]
    source = max(rank for rank, count in enumerate(counts) if count == max(counts))
    if ema is not None:
        for tensor in ema.state_dict().values():  # weights, buffers and the count of updates averaged
            dist.broadcast(tensor, src=source)
    # Walk the parameters, not the state: a rank that has not stepped yet (queue mode can leave it
    # without a shard) has no momentum buffers, and every rank must make the same broadcasts.
    for group in optimizer.param_groups:
        if not group["momentum"]:
            continue
        for parameter in group["params"]:
            state = optimizer.state[parameter]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(parameter)
            dist.broadcast(state["momentum_buffer"], src=source)


def replicas_in_sync(model: torch.nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> bool:
    """Whether every rank holds the same weights and momentum (a cheap checksum compare)."""
    if not info.enabled:
        return True
    total = sum(p.detach().double().sum().item() for p in model.parameters())
    total += sum(
        v.double().sum().item()
        for s in optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.dtype.is_floating_point
    )
    sums = [s[0] for s in all_gather_numbers([total], info)]
    return max(sums) - min(sums) <= 1e-6 * max(1.0, abs(sums[0]))
