"""Stopping together: a pre-emption signal or a rank's own failure ends the epoch at a step every rank agrees
on, so no rank is left waiting in a collective for one that has gone.

SIGTERM (Kubernetes eviction, spot reclaim, `kubectl delete`, NGC pre-emption) and SIGUSR1 (Slurm's
`--signal` before a time limit) are noted by the handler (imagenet_train.waiting), which also ends any wait
in progress. Once per step every rank contributes
[its signal, 1 + its rank if it failed] to an all-reduce (max); all ranks read the same answer at the same
step and leave the loop together. Under Join (split and queue modes) the vote is a Joinable, so ranks that
already ran out of data keep voting in the shadow loop. On GPU the answer is read `lag` steps later from
pinned memory, so the vote never makes the host wait for the device.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Joinable, JoinHook

from imagenet_train import waiting
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.training.dist import DistInfo

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
    here = f"{epoch}:{step}".encode()
    try:
        store.set(f"{prefix}/{info.rank}", here)
        keys = [f"{prefix}/{rank}" for rank in range(info.world)]
        ends = time.monotonic() + AGREE_S
        while not store.check(keys):  # polled: the store's own wait logs its timeout as a warning
            if time.monotonic() > ends:
                return False
            time.sleep(0.05)
        return all(store.get(key) == here for key in keys)
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
class Verdict:
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

    def cast(self) -> Verdict:
        """Vote for this step; the verdict of the step `lag` votes ago (identical on every rank)."""
        self._issue()
        if self.cast_count <= self.lag:
            return Verdict(0, 0)
        slot = self.slots[(self.cast_count - 1 - self.lag) % len(self.slots)]
        if slot.event is not None:
            slot.event.synchronize()  # recorded `lag` steps ago: long done, no wait in practice
        return Verdict(int(slot.host_out[0]), int(slot.host_out[1]))

    def settle(self, *numbers: int) -> tuple[Verdict, list[int]]:
        """Outside any Join: every rank's final word plus the maxima of `numbers` (e.g. steps taken)."""
        values = torch.tensor([*self._local(), *numbers], dtype=torch.int64)
        if self.info.enabled:
            values = values.to(self.info.device)
            dist.all_reduce(values, op=dist.ReduceOp.MAX)
        result = values.tolist()
        self.cast_count = 0  # a new loop starts its own lag
        return Verdict(result[0], result[1]), result[2:]

    def raise_failure(self, verdict: Verdict) -> None:
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
