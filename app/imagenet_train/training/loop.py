"""The DDP training loop in torchvision's shape: `train_one_epoch` and `evaluate`, called by `run` once per epoch,
with the per-step extras (key logs, mid-epoch checkpoints, the pre-emption vote) as hooks."""

from __future__ import annotations

import functools
import json
import logging
import signal
import time
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from tqdm import tqdm

from imagenet_train.config import Config
from imagenet_train.datasets.source import DataSource
from imagenet_train.errors import ImagenetTrainError, Preempted
from imagenet_train.planning.position import Position
from imagenet_train.planning.schedule import Schedule
from imagenet_train.training import evaluation, progress, step
from imagenet_train.training.dist import DistInfo
from imagenet_train.training.hooks import (
    KeysRead,
    MidEpochCheckpoint,
    PositionLog,
    StepHook,
    StepVote,
    Stopping,
    StopRequest,
    StopVote,
    replicas_in_sync,
    stop_waiting,
)
from imagenet_train.training.metrics import run_metrics
from imagenet_train.training.parts import RunParts, Saved

log = logging.getLogger(__name__)

STOP_UPLOAD_S = 30.0  # after a pre-emption signal, how long the results mirror may take (part of the grace period)


class Trainer:
    """One training run on one rank: the model, its step, its batches, its state and where results go (the
    batches and the run directory made by `parts` once the schedule and the model exist)."""

    def __init__(
        self, cfg: Config, info: DistInfo, source: DataSource, parts: RunParts, request: StopRequest | None = None
    ):
        self.cfg, self.info, self.source = cfg, info, source
        self.vote = StepVote(request or StopRequest(), info)
        self.schedule = Schedule.of(cfg, source.train_samples, source.train_sizes, info.world)
        self.exact = self.schedule.exact  # every sample once; uneven batch counts under Join
        self.step = step.build(cfg, info, source.num_classes, self.schedule)
        self.model, self.ddp, self.ema, self.amp = self.step.model, self.step.wrapper, self.step.ema, self.step.amp
        step.seed_augmentation(cfg.run.seed, info.rank)
        for advice in self.schedule.advice() if info.is_main else ():  # a large batch with plain SGD, say
            log.warning("pre-flight: %s", advice)
        steps, length = self.schedule.epoch_batches(0), self.schedule.interval_epochs  # the ramp's data epochs
        self.batches = parts.batches(source, steps, length)
        facts = {"schedule": self.schedule.facts(), "config": json.loads(cfg.to_json())}
        saved: dict[str, Saved] = {"model": self.model, "optimizer": self.step.optimizer, "scaler": self.step.scaler}
        self.dir = parts.directory(saved, facts)
        if self.ema:
            self.dir.state.add("ema", self.ema)
        self.start_epoch = 0
        self.position: Position | None = None  # set when resuming inside an epoch
        self.consumed: frozenset[str] = frozenset()  # exact modes, resuming inside an epoch: the keys it read
        self.stop_position: Position | None = None  # where a pre-emption stopped the epoch
        self.stop_signal = 0
        self.progress = progress.RunProgress.of(self.schedule, info.is_main)  # the TrainJob's status (rank 0)
        self.metrics = run_metrics(cfg.run.metrics_port, info)  # Prometheus' /metrics on every rank
        self.metrics.count_outages([loader for loader in (self.batches.train, self.batches.val) if loader])

    # -- checkpoints --------------------------------------------------------------------------
    def resume(self) -> None:
        """--resume: load the newest (or the named) checkpoint, fetched from --results first when asked."""
        run, info = self.cfg.run, self.info
        if not run.resume:
            return
        if run.resume == "latest" and run.results:
            self.dir.mirror.fetch_for_resume(info.is_main)
            if info.enabled:
                dist.barrier()  # every node's local rank 0 has fetched before any rank looks for the checkpoint
        path = self.dir.checkpoint_for(run.resume, info.rank, info.world)
        if path is None:
            if info.is_main:
                log.warning("no checkpoint in %s; starting from epoch 0", self.dir.path)
            return
        self.start_epoch, self.position = self.dir.state.restore(path)
        self.step.keep_kernels(self.cfg.optim.fused_optimizer)
        if self.exact and self.position and self.position.step:  # the samples the resumed epoch already read
            self.consumed = self.dir.consumed_keys(self.position)
        if self.dir.records:
            self.dir.records.keep_before(self.start_epoch)  # the epochs from here are trained again
            where = f", step {self.position.step}" if self.position else ""
            print(f"resumed from {path}: continuing at epoch {self.start_epoch}{where}", flush=True)

    def save(self, epoch: int, position: Position | None = None) -> Path | None:
        """Every rank: rank 0 writes the checkpoint, and all learn together whether that worked."""
        path, began = None, time.perf_counter()
        if self.info.is_main:
            try:
                path = self.dir.state.write(epoch, position)
            except ImagenetTrainError as error:
                self.vote.fail(error)
        verdict, _ = self.vote.settle()
        self.vote.raise_failure(verdict)
        self.metrics.checkpoint_written(time.perf_counter() - began)  # every rank: they learnt it together
        return path

    # -- one epoch ----------------------------------------------------------------------------
    def _prepare_epoch(self, epoch: int) -> Position:
        """Point the loader at this epoch, or at what is left of it when resuming inside it."""
        info = self.info
        start = self.schedule.start(self.position, epoch)
        skip = self.consumed if start.skip_consumed else frozenset()
        self.position, self.consumed = None, frozenset()
        self.batches.train.start_epoch(epoch, skip_keys=skip, resume_tag=start.resume_tag, batches=start.batches)
        saved = start.resumed_from
        if start.world_changed and saved is not None and info.is_main:  # world_changed comes with resumed_from
            what = (
                f"the {len(skip)} samples already seen are skipped and the rest split over the new ranks"
                if self.exact
                else f"continuing with {start.batches} batches per rank, the {saved.samples_left} samples the "
                "epoch still owed"
            )
            print(f"world size changed from {saved.world} to {info.world} mid-epoch: {what}", flush=True)
        return start.position

    def _hooks(
        self, epoch: int, steps: int, position: Position, tally: progress.EpochTally
    ) -> tuple[list[StepHook], StopVote]:
        """This epoch's per-step extras (`steps` batches) and its stop vote, the last of them: it runs after every
        hook that may fail."""
        info, run, start = self.info, self.cfg.run, position.step
        hooks: list[StepHook] = [self.ema.at(epoch * self.schedule.interval, steps)] if self.ema else []
        hooks.append(self.metrics.at(epoch, tally.wait, info.device))
        if self.exact:
            hooks.append(PositionLog(self.dir.key_log(epoch, info.rank, start), self.vote))
        if run.log_keys:  # a resumed part of an epoch appends
            hooks.append(KeysRead(functools.partial(self.dir.write_keys, "train", epoch, info.rank, append=start > 0)))
        if run.checkpoint_every and info.is_main:
            hooks.append(
                MidEpochCheckpoint(
                    run.checkpoint_every, steps, lambda step: self._checkpoint_inside(position, step), self.vote
                )
            )
        joined = (self.ddp, self.step.optimizer, self.ema.averaged if self.ema else None)
        vote = StopVote(self.vote, *(joined if self.exact and info.enabled else ()))
        return [*hooks, self.progress.at(epoch), vote], vote

    def _owed(self, position: Position, step: int) -> int:
        """Samples of the epoch still owed after `step` (resampled mode's cut epochs; 0 in exact modes)."""
        batches = self.batches.train.batches
        return (batches - (step - position.step)) * self.schedule.global_batch if batches else 0

    def _checkpoint_inside(self, position: Position, step: int) -> None:
        self.dir.state.write(
            position.epoch - 1,
            Position(position.epoch, step, position.segments, self.info.world, self._owed(position, step)),
        )
        self.dir.mirror.sync()

    def train_one_epoch(self, epoch: int) -> dict:
        """Train one epoch (or what is left of it); returns its record, identical on every rank."""
        position = self._prepare_epoch(epoch)
        info, steps, loader = self.info, self.schedule.epoch_batches(epoch), self.batches.train
        loss_sum = torch.zeros((), dtype=torch.float64, device=info.device)
        tally = progress.EpochTally(position.step, loader.damage(), loss_sum, self.schedule.base_lr)
        (hooks, vote), stopped = self._hooks(epoch, steps, position, tally), False
        bar = tqdm(
            total=self.schedule.known_batches(epoch),  # queue mode: no total, a rank's batches follow its claims
            initial=tally.step,
            desc=f"epoch {epoch}",
            unit="batch",
            disable=not info.is_main,
            mininterval=2,
        )
        self.ddp.train()
        try:
            with bar, vote.joining():  # a stop in the wait for a batch leaves both by exception: no Join shadow loop
                for images, labels, keys in tally.wait.timed(self.batches.train_batches()):
                    for hook in hooks:
                        hook.before_step(tally.step, keys)
                    tally.lr = self.schedule.lr(epoch, tally.step, steps)
                    group = self.schedule.accumulation(tally.step, steps)
                    tally.add(self.step(images, labels, group, tally.lr), len(labels))
                    bar.update()
                    if any([hook.after_step(tally.step) for hook in hooks]):  # a list: every hook runs every step
                        stopped = True
                        break
        except Stopping as stop:
            self.batches.abandon()
            stopped = stop_waiting(stop, info, epoch, tally.step, position.step)
        finally:
            for hook in hooks:
                hook.end()
        verdict, steps_taken = vote.settle(stopped, tally.step)
        if steps_taken is not None:
            owed = self._owed(position, steps_taken)
            self.stop_position = Position(epoch, steps_taken, position.segments, info.world, owed)
        self.stop_signal = verdict.signum
        return {**tally.record(loader.damage(), info), **loader.epoch_report()}

    def evaluate(self, epoch: int) -> dict:
        """Loss, top-1 and top-5 over every rank's share of the val shards ({} without val shards)."""
        keys = functools.partial(self.dir.write_keys, "val", epoch, self.info.rank) if self.cfg.run.log_keys else None
        model, info, classes, tta = self.model, self.info, self.source.num_classes, self.cfg.run.val_tta
        channels_last = self.step.channels_last
        return evaluation.evaluate_run(
            model, self.ema, self.batches, info, self.amp, channels_last, classes, tta, epoch, keys
        )

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> dict:
        """Train from the start (or the resumed point) to the last epoch; returns the last epoch's record."""
        self.resume()
        self.dir.begin(self.cfg, self.info, self.schedule, self.source, self.amp, self.start_epoch)
        last: dict = {}
        for epoch in range(self.start_epoch, self.schedule.epochs):
            started = time.time()
            record = {"epoch": epoch, **self.train_one_epoch(epoch)}
            if self.stop_position:
                self.stop(self.save(epoch - 1, self.stop_position), self.stop_position)
            if (epoch + 1) % self.cfg.run.eval_every == 0 or epoch + 1 == self.schedule.epochs:
                record.update(self.evaluate(epoch))
            if epoch + 1 == self.schedule.epochs:  # RUN_DIR/final.pt: raw or EMA, whichever scored better
                record["final_weights"] = evaluation.final_choice(record, self.ema)
                if self.info.is_main:
                    self.vote.guard(
                        evaluation.write_final, self.dir.write_final, self.model, self.ema, record
                    )  # settled at the save
            last = self.finish_epoch(epoch, record, started)
        if self.dir.records:
            self.dir.records.close()
        self.dir.mirror.finish(self.cfg.loader.io_timeout)
        self.batches.close()
        return last

    def finish_epoch(self, epoch: int, record: dict, started: float) -> dict:
        """Complete the epoch's record, checkpoint, write it down, mirror; stop here if a signal came meanwhile."""
        if self.cfg.run.total_samples:
            record["samples_seen"] = (
                min(self.schedule.total, (epoch + 1) * self.schedule.interval) * self.schedule.global_batch
            )
        record["replicas_in_sync"] = replicas_in_sync(self.model, self.step.optimizer, self.info)
        record["epoch_time_s"] = round(time.time() - started, 3)
        record["samples_per_s"] = round(record["train_samples"] / max(record["epoch_time_s"], 1e-9), 1)
        self.metrics.epoch_end(record, self.batches.train.damage())
        if self.dir.records:  # before the checkpoint: a checkpoint of an epoch implies its line (see run_record)
            self.dir.records.write(record, sum(self.schedule.epoch_batches(e) for e in range(epoch + 1)))
            if not record["replicas_in_sync"]:
                log.error("replicas diverged at epoch %d: weights differ across ranks", epoch)
        path = self.save(epoch)
        self.dir.mirror.sync()
        verdict, _ = self.vote.settle()  # a signal during evaluation or the checkpoint stops here
        if verdict.signum or self.stop_signal:
            self.stop(path, Position(epoch + 1), verdict.signum or self.stop_signal)
        self.progress.epoch_end(epoch, record)  # after the checkpoint: the run's last waits for its 100% to go out
        return record

    def stop(self, path: Path | None, position: Position, signum: int = 0) -> NoReturn:
        """Leave after a pre-emption signal: the position is saved; results are flushed, briefly."""
        signum = signum or self.stop_signal
        if self.info.is_main:
            where = f"epoch {position.epoch} step {position.step}"
            name = signal.Signals(signum).name
            print(f"stopped by {name} at {where}: checkpoint {path}; continue with --resume latest", flush=True)
        self.dir.mirror.sync()
        self.dir.mirror.finish(STOP_UPLOAD_S, stoppable=False)
        raise Preempted(signum)
