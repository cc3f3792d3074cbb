"""How far a run has come, on one rank and for the cluster: an epoch's running totals and its record summed
over every rank (`EpochTally`), the time the loop waits for its next batch (`DataWait`), and the TrainJob's
progress in its status (Kubeflow Trainer's `status.trainerStatus`), reported by rank 0 when the Trainer injected
its status endpoint: the share of the run's planned samples seen, an ETA from the rate measured in this process,
and the last epoch's loss, top-1 and images per second. A per-step hook posts at most every PERIOD_S seconds, once
more at each epoch's end, and 100% when the run ends; the posts leave on the poster's thread, so a slow or failing
endpoint costs the loop nothing. The endpoint's client (its contract, the token, no redirects) is
status_client.py."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from imagenet_train import waiting
from imagenet_train.planning.schedule import Schedule
from imagenet_train.training.dist import DistInfo, all_gather_numbers, all_sum
from imagenet_train.training.hooks import StepHook
from imagenet_train.training.status_client import TIMEOUT_S, Endpoint, Poster, status_body

log = logging.getLogger(__name__)

Item = TypeVar("Item")


def evaluating(batches: Iterable[Item], what: str, shown: bool) -> Iterable[Item]:
    """`batches` with a progress bar while they are scored (on rank 0: `shown`); evaluation takes minutes."""
    from tqdm import tqdm

    return tqdm(batches, desc=what, unit="batch", disable=not shown, leave=False, mininterval=1.0)


class DataWait:
    """Times a loop's waits for the next item against the loop's whole time."""

    def __init__(self) -> None:
        self.waited = 0.0
        self.started: float | None = None
        self.ended: float | None = None

    def timed(self, items: Iterable[Item], where: str = "waiting for the next batch") -> Iterator[Item]:
        """Yield from `items`, adding the time spent inside each `next` to `waited`; a stop signal during a `next`
        raises waiting.Stopping there (the loader's workers may be asleep in an outage), saying `where`."""
        iterator = iter(items)
        self.started = time.perf_counter()
        try:
            while True:
                before = time.perf_counter()
                try:
                    with waiting.interruptible(where):
                        item = next(iterator)
                except StopIteration:
                    return
                finally:
                    self.waited += time.perf_counter() - before
                yield item
        finally:
            self.ended = time.perf_counter()

    @property
    def fraction(self) -> float:
        """Waiting time over loop time (0 before the loop ran)."""
        if self.started is None:
            return 0.0
        total = (self.ended or time.perf_counter()) - self.started
        return min(1.0, self.waited / total) if total > 0 else 0.0


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


PERIOD_S = 5.0  # Kubeflow's own SDK posts at most this often
FINAL_WAIT_S = TIMEOUT_S + 1.0  # the run's end waits this long at most for its 100% to be posted


class RunProgress:
    """Rank 0's report of the whole run; without an endpoint (other ranks, no Trainer) every method does nothing."""

    def __init__(self, schedule: Schedule, poster: Poster | None):
        self.poster = poster
        self.total, self.interval, self.epochs = schedule.total, schedule.interval, schedule.epochs
        self.global_batch = schedule.global_batch
        self.metrics: dict[str, float] = {}  # the last finished epoch's
        self.epoch_rate: float | None = None  # and its images per second
        self.first: tuple[float, int] | None = None  # (time, steps done) at this process's first report
        self.steps = 0  # steps per rank done at the last report
        self.last_post = -math.inf
        self.ended = False  # 100% was posted: a run that reaches its last epoch and then ends must not post it twice

    @classmethod
    def of(cls, schedule: Schedule, is_main: bool, env: Mapping[str, str] = os.environ) -> RunProgress:
        """The run's progress report: posting on rank 0 when the Trainer's variables are set, silent otherwise."""
        endpoint = Endpoint.from_env(env) if is_main else None
        if endpoint:
            log.info("trainer status: reporting progress to %s (at most every %gs)", endpoint.url, PERIOD_S)
        return cls(schedule, Poster(endpoint) if endpoint else None)

    def at(self, epoch: int) -> StepHook:
        """This epoch's hook (one that does nothing when there is nothing to report to)."""
        return EpochProgress(self, epoch) if self.poster else StepHook()

    def done(self, epoch: int, step: int) -> int:
        """Steps per rank of the planned run done after `step` steps of `epoch`."""
        return min(self.total, epoch * self.interval + step)

    def report(self, done: int, rate: float | None = None, final: bool = False, force: bool = False) -> None:
        """Post the progress after `done` steps, unless one was posted less than PERIOD_S ago (`force`: post);
        `rate`: the current images per second, when measured."""
        now = time.monotonic()
        self.first, self.steps = self.first or (now, done), done
        if self.poster is None or not (final or force or now - self.last_post >= PERIOD_S):
            return
        self.last_post = now
        since, before = self.first
        speed = (done - before) / (now - since) if done > before and now > since else 0.0  # steps per second
        remaining = 0.0 if final else (self.total - done) / speed if speed else None
        percent = 100 if final else min(99, 100 * done // max(1, self.total))  # 100 only once the run has ended
        shown = {**self.metrics, **({"img_per_s": round(rate, 1)} if rate else {})}
        self.poster.submit(status_body(percent, remaining, shown, time.time()))

    def epoch_end(self, epoch: int, record: dict) -> None:
        """After the epoch's record is complete: post with its metrics; after the last, post 100% and wait for
        it (FINAL_WAIT_S at most)."""
        if self.poster is None:
            return
        keys = {"epoch": "epoch", "train_loss": "loss", "top1": "top1", "val_loss": "val_loss"}
        self.metrics = {name: record[key] for key, name in keys.items() if key in record}
        self.epoch_rate = record.get("samples_per_s")
        if epoch + 1 >= self.epochs:
            self.steps = self.done(epoch + 1, 0)
            self.end()
        else:
            self.report(self.done(epoch + 1, 0), self.epoch_rate, force=True)

    def end(self) -> None:
        """The run has ended well, at its last epoch or before it (early stopping, a time or step limit): post 100%
        with the last epoch's metrics unless that was done, and wait for it (FINAL_WAIT_S at most). Never call
        it for a run that failed or was stopped to resume: 100% tells the TrainJob's watchers the run is done."""
        if self.poster is None or self.ended:
            return
        self.ended = True
        self.report(self.steps, self.epoch_rate, final=True)
        if not self.poster.drain(FINAL_WAIT_S):
            log.warning("trainer status: the final report was not posted within %gs", FINAL_WAIT_S)


class EpochProgress(StepHook):
    """One epoch's share of the report: after each step, the steps done and the epoch's images per second."""

    def __init__(self, run: RunProgress, epoch: int):
        self.run, self.epoch = run, epoch
        self.first: tuple[float, int] | None = None

    def after_step(self, step: int) -> bool:
        """Report (when due) the progress after `step` steps of the epoch."""
        now = time.monotonic()
        self.first = self.first or (now, step)
        since, before = self.first
        rate = (step - before) * self.run.global_batch / (now - since) if step > before else None
        self.run.report(self.run.done(self.epoch, step), rate)
        return False
