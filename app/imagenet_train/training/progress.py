"""A TrainJob's progress in its status (Kubeflow Trainer's `status.trainerStatus`), reported by rank 0 when the
Trainer injected its status endpoint: the share of the run's planned samples seen, an ETA from the rate measured
in this process, and the last epoch's loss, top-1 and images per second. A per-step hook that posts at most every
PERIOD_S seconds, once more at each epoch's end, and 100% when the run ends; the posts leave on the poster's
thread (trainer_status.py), so a slow or failing endpoint costs the loop nothing."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping

from imagenet_train.planning.schedule import Schedule
from imagenet_train.training.hooks import StepHook
from imagenet_train.training.trainer_status import TIMEOUT_S, Endpoint, Poster, status_body

log = logging.getLogger(__name__)

PERIOD_S = 5.0  # Kubeflow's own SDK posts at most this often
FINAL_WAIT_S = TIMEOUT_S + 1.0  # the run's end waits this long at most for its 100% to be posted


class RunProgress:
    """Rank 0's report of the whole run; without an endpoint (other ranks, no Trainer) every method does nothing."""

    def __init__(self, schedule: Schedule, poster: Poster | None):
        self.poster = poster
        self.total, self.interval, self.epochs = schedule.total, schedule.interval, schedule.epochs
        self.global_batch = schedule.global_batch
        self.metrics: dict[str, float] = {}  # the last finished epoch's
        self.first: tuple[float, int] | None = None  # (time, steps done) at this process's first report
        self.last_post = -math.inf

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
        self.first = self.first or (now, done)
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
        final = epoch + 1 >= self.epochs
        self.report(self.done(epoch + 1, 0), record.get("samples_per_s"), final=final, force=True)
        if final and not self.poster.drain(FINAL_WAIT_S):
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
