"""The DDP training loop: epochs of train steps (under Join in split mode), evaluation, metrics, checkpoints."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from imagenet_train.config import Config
from imagenet_train.datasets.source import DataSource, run_source
from imagenet_train.errors import ImagenetTrainError, PeerLost, Preempted
from imagenet_train.loading.dali import DaliAugment, DaliDecoder
from imagenet_train.loading.options import Decoder
from imagenet_train.loading.prefetch import device_batches
from imagenet_train.loading.presets import normalize
from imagenet_train.loading.shard_queue import job_queue
from imagenet_train.loading.stream import EpochLoader
from imagenet_train.loading.workers import worker_context
from imagenet_train.planning import plan
from imagenet_train.planning.plan import Mode
from imagenet_train.planning.position import Position
from imagenet_train.planning.resume import epoch_start
from imagenet_train.planning.schedule import Schedule
from imagenet_train.training import checkpoint, evaluation, models
from imagenet_train.training.data_wait import DataWait
from imagenet_train.training.dist import (
    DistInfo,
    all_gather_numbers,
    all_sum,
    cleanup,
    init_distributed,
    is_peer_lost,
    peer_lost_reason,
)
from imagenet_train.training.events import EpochEvents
from imagenet_train.training.key_log import KeyLog, consumed_keys
from imagenet_train.training.parts import (
    amp_dtype,
    augmentation_seed,
    parameter_groups,
    preflight_check,
    seed_augmentation,
    train_loader,
    val_loader,
)
from imagenet_train.training.preempt import StepVote, StopRequest
from imagenet_train.training.replicas import replicas_in_sync, sync_optimizer_state
from imagenet_train.training.results import ResultsUploader, fetch_for_resume

log = logging.getLogger(__name__)

STOP_UPLOAD_S = 30.0  # after a pre-emption signal, how long the results mirror may take (part of the grace period)


class Trainer:
    """One training run on one rank."""

    def __init__(self, cfg: Config, info: DistInfo, source: DataSource, request: StopRequest | None = None):
        self.cfg, self.info, self.source = cfg, info, source
        self.vote = StepVote(request or StopRequest(), info)
        self.stop_position: Position | None = None  # where a pre-emption stopped the epoch
        self.stop_signal = 0
        data, run = cfg.data, cfg.run
        # split and queue read every sample once per epoch, with uneven batch counts evened out by Join.
        self.exact = data.mode in (Mode.SPLIT, Mode.QUEUE)
        self.run_dir = Path(run.run_dir)
        torch.manual_seed(run.seed)  # identical initial weights on every rank
        model = models.create(run, source.num_classes, info.is_main).to(info.device)
        self.channels_last = run.channels_last and info.device.type == "cuda"
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.ddp = DistributedDataParallel(model) if info.enabled else model
        if info.device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed input shapes: pick the fastest kernels once
        self.forward = self._compiled() if run.compile else self.ddp
        seed_augmentation(run.seed, info.rank)
        self.schedule = Schedule.of(cfg, source.train_samples, source.train_sizes, info.world)
        self.global_batch, self.base_lr = self.schedule.global_batch, self.schedule.base_lr
        self.optimizer = torch.optim.SGD(
            parameter_groups(model, cfg.optim.weight_decay),
            lr=self.base_lr,
            momentum=cfg.optim.momentum,
            nesterov=cfg.optim.nesterov,
        )
        self.amp = amp_dtype(run.amp, info.device)
        self.scaler = torch.amp.GradScaler(info.device.type, enabled=self.amp == torch.float16)
        self.criterion = torch.nn.CrossEntropyLoss(label_smoothing=cfg.optim.label_smoothing)
        self.preflight()
        self.dali: dict = {}  # loader -> its DaliDecoder, made on first use
        self.train_augment = DaliAugment(data.image_size, True, data.min_crop_scale, data.hflip)
        self.val_augment = DaliAugment(data.image_size, False, resize=data.val_resize or None)
        self.train_loader = train_loader(cfg, info, source, self.schedule, self._queue())
        self.val_loader = val_loader(cfg, info, source)
        self.start_epoch = 0
        self.position: Position | None = None  # set when resuming inside an epoch
        # One uploader per node mirrors its run directory (rank 0's checkpoints, every rank's key logs).
        self.uploader = (
            ResultsUploader(self.run_dir, run.results, data.io_timeout)
            if run.results and info.local_rank == 0
            else None
        )
        self.events = EpochEvents(self.run_dir) if run.tensorboard and info.is_main else None

    def _compiled(self) -> torch.nn.Module:
        if self.exact and self.info.enabled:
            if self.info.is_main:
                log.warning("--compile: not applied in %s mode across ranks (Join's collectives)", self.cfg.data.mode)
            return self.ddp
        return torch.compile(self.ddp)

    def preflight(self) -> None:
        """The planner's check of this launch; every rank reaches the same verdict from the same inputs."""
        assessment = preflight_check(self.cfg, self.source.train_sizes, self.info.world)
        if assessment and self.info.is_main and assessment.level is not plan.Verdict.OK:
            log.warning("pre-flight: %s; suggested fix: %s", assessment.verdict, assessment.fix)

    def batches(self, loader: EpochLoader, augment: DaliAugment) -> Iterable:
        """One epoch of `loader` as (images, labels, keys) on the device: decoded by DALI under --decoder dali,
        else copied there one step ahead of the step that uses them."""
        if self.cfg.data.decoder != Decoder.DALI:
            return device_batches(loader, self.info.device)
        if loader not in self.dali:
            self.dali[loader] = DaliDecoder(
                loader,
                augment,
                self.cfg.data.batch_size,
                self.info.device,
                threads=max(self.cfg.data.workers, 1),
                seed=augmentation_seed(self.cfg.run.seed, self.info.rank),
            )
        return device_batches(self.dali[loader], self.info.device)

    def _queue(self):
        """The run's shard queue in queue mode, under a name no earlier attempt of this run used."""
        if self.cfg.data.mode != Mode.QUEUE:
            return None
        generation = torch.randint(0, 2**62, (1,), dtype=torch.int64)
        if self.info.enabled:
            dist.broadcast(generation, src=0)
        return job_queue(f"imagenet-train/queue/{int(generation)}", self.info.world, worker_context())

    # -- checkpoints --------------------------------------------------------------------------
    def resume(self) -> None:
        wanted = self.cfg.run.resume
        if not wanted:
            return
        if wanted == "latest" and self.cfg.run.results:
            if self.info.local_rank == 0:
                fetched = fetch_for_resume(self.cfg.run.results, self.run_dir, self.cfg.data.io_timeout)
                if self.info.is_main:
                    print(f"fetched {fetched} files from {self.cfg.run.results} to resume", flush=True)
            if self.info.enabled:
                dist.barrier()
        path = checkpoint.latest(str(self.run_dir)) if wanted == "latest" else Path(wanted)
        if path is None:
            if self.info.is_main:
                log.warning("no checkpoint in %s; starting from epoch 0", self.run_dir)
            return
        if not path.is_file():
            raise ImagenetTrainError(f"--resume: checkpoint {path} does not exist")
        state = checkpoint.load(path)
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
            self.start_epoch = int(state["epoch"]) + 1
            where = ""
            if state.get("position"):
                self.position = Position.from_dict(state["position"])
                self.start_epoch = self.position.epoch
                where = f", step {self.position.step}"
        except (KeyError, TypeError, ValueError, RuntimeError) as error:  # another model, or a hand-made file
            reason = str(error).strip().splitlines()[0][:120] if str(error).strip() else type(error).__name__
            raise ImagenetTrainError(f"{path}: checkpoint does not fit this run ({reason})") from None
        if self.info.is_main:
            print(f"resumed from {path}: continuing at epoch {self.start_epoch}{where}", flush=True)

    def _write_checkpoint(self, epoch: int, position: Position | None = None) -> Path:
        """Rank 0 writes the state after `epoch` completed, or at `position` inside the next epoch."""
        state = {
            "epoch": epoch,
            "position": position.to_dict() if position else None,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "schedule": {"base_lr": self.base_lr, "epochs": self.schedule.epochs, "total_batches": self.schedule.total},
            "config": json.loads(self.cfg.to_json()),
        }
        step = position.step if position else None
        path = checkpoint.checkpoint_path(str(self.run_dir), position.epoch if position else epoch, step)
        checkpoint.save(state, path)
        checkpoint.prune_steps(str(self.run_dir), keep=path)
        return path

    def save(self, epoch: int, position: Position | None = None) -> Path | None:
        """Every rank: rank 0 writes the checkpoint, and all learn together whether that worked."""
        path = None
        if self.info.is_main:
            try:
                path = self._write_checkpoint(epoch, position)
            except ImagenetTrainError as error:
                self.vote.fail(error)
        verdict, _ = self.vote.settle()
        self.vote.raise_failure(verdict)
        return path

    # -- one epoch ----------------------------------------------------------------------------
    def set_lr(self, epoch: int, step: int, steps: int) -> float:
        """Warmup then cosine over the run's global steps; identical on every rank at every step."""
        lr = self.schedule.lr(epoch, step, steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _prepare_epoch(self, epoch: int) -> Position:
        """Point the loader at this epoch, or at what is left of it when resuming inside it."""
        data = self.cfg.data
        start = epoch_start(
            self.position,
            epoch,
            data.mode,
            self.info.world,
            data.batch_size,
            self.schedule.epoch_batches(epoch),
            data.epoch_batches,
        )
        self.position = None
        skip_keys = frozenset(consumed_keys(self.run_dir, start.resumed_from) if start.skip_consumed else ())
        self.train_loader.start_epoch(epoch, skip_keys=skip_keys, resume_tag=start.resume_tag, batches=start.batches)
        saved = start.resumed_from
        if start.world_changed and self.info.is_main:
            what = (
                f"the {len(skip_keys)} samples already seen are skipped and the rest split over the new ranks"
                if self.exact
                else f"continuing with {start.batches} batches per rank, the {saved.samples_left} samples the "
                "epoch still owed"
            )
            print(f"world size changed from {saved.world} to {self.info.world} mid-epoch: {what}", flush=True)
        return start.position

    def train_epoch(self, epoch: int) -> dict:
        info, loader = self.info, self.train_loader
        position = self._prepare_epoch(epoch)
        start = position.step
        self.ddp.train()
        steps = self.schedule.epoch_batches(epoch)
        loss_sum = torch.zeros((), dtype=torch.float64, device=info.device)
        samples, batches, lr, keys, broke = 0, start, self.base_lr, [], 0
        damage_before = loader.damage()
        every = self.cfg.run.checkpoint_every
        key_log = KeyLog(self.run_dir, epoch, info.rank, start) if self.exact else None
        bar = tqdm(
            total=steps, initial=start, desc=f"epoch {epoch}", unit="batch", disable=not info.is_main, mininterval=2
        )
        join = Join([self.ddp, self.vote]) if self.exact and info.enabled else contextlib.nullcontext()
        wait = DataWait()
        with bar, join:
            for images, labels, batch_keys in wait.timed(self.batches(loader, self.train_augment)):
                if key_log:
                    self._guard(key_log.fetched, batches, batch_keys)  # before the step: a kill loses nothing
                lr = self.set_lr(epoch, batches, steps)
                loss_sum += self.step(images, labels) * len(labels)
                samples += len(labels)
                batches += 1
                if self.cfg.run.log_keys:
                    keys.extend(batch_keys)
                bar.update()
                if every and batches % every == 0 and batches < steps and info.is_main:
                    owed = (loader.batches - (batches - start)) * self.global_batch if loader.batches else 0
                    self._guard(
                        self._write_checkpoint, epoch - 1, Position(epoch, batches, position.segments, info.world, owed)
                    )
                    self.mirror()
                if self.vote.cast():
                    broke = 1
                    break
        if key_log:
            key_log.close()
        verdict, (stopped_mid_epoch, steps_taken) = self.vote.settle(broke, batches)
        self.vote.raise_failure(verdict)
        if self.exact and info.enabled:
            sync_optimizer_state(self.optimizer, batches, self.info)
        self._write_keys("train", epoch, keys, append=bool(start))
        if stopped_mid_epoch:
            owed = (loader.batches - (steps_taken - start)) * self.global_batch if loader.batches else 0
            self.stop_position = Position(epoch, steps_taken, position.segments, info.world, owed)
        self.stop_signal = verdict.signum
        corrupt, broken, lost = (now - before for now, before in zip(loader.damage(), damage_before, strict=True))
        total_loss, total_samples, corrupt, broken, lost = all_sum(
            [loss_sum.item(), samples, corrupt, broken, lost], info
        )
        per_rank = [int(b[0]) - start for b in all_gather_numbers([batches], info)]
        waits = [round(w[0], 4) for w in all_gather_numbers([wait.fraction], info)]
        resumed = {"resumed_from_step": start} if start else {}
        return {
            **resumed,
            "lr": lr,
            "train_loss": total_loss / max(total_samples, 1),
            "train_samples": int(total_samples),
            "batches_per_rank": per_rank,
            "data_wait_fraction": round(sum(waits) / len(waits), 4),
            "data_wait_per_rank": waits,
            "corrupt_samples": int(corrupt),
            "broken_shards": int(broken),
            "lost_samples": int(lost),
        }

    def _guard(self, action, *args) -> None:
        """Run a rank-local write; a failure stops every rank at the next vote instead of leaving them waiting."""
        try:
            action(*args)
        except (ImagenetTrainError, OSError) as error:
            self.vote.fail(error if isinstance(error, ImagenetTrainError) else ImagenetTrainError(f"{error}"))

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One optimisation step on a uint8 batch; returns the loss (on device, no sync)."""
        device = self.info.device
        if len(labels) == 1:  # a worker's only sample (damaged data): BatchNorm cannot train on a batch of one
            images, labels = images.expand(2, *images.shape[1:]), labels.expand(2)
        images = normalize(images.to(device, non_blocking=True), self.channels_last)  # on the device already
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=self.amp, enabled=self.amp is not None):
            loss = self.criterion(self.forward(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.cfg.optim.clip_grad_norm:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the loss-scaled ones
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.clip_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.detach().double()

    @torch.no_grad()
    def evaluate(self, epoch: int) -> dict:
        if self.val_loader is None:
            return {}
        self.model.eval()
        batches = self.batches(self.val_loader, self.val_augment)
        record, keys = evaluation.evaluate(
            self.model,
            self.val_loader,
            batches,
            self.info,
            self.amp,
            self.channels_last,
            self.source.num_classes,
            keep_keys=self.cfg.run.log_keys,
        )
        self._write_keys("val", epoch, keys)
        return record

    def _write_keys(self, split: str, epoch: int, keys: list[str], append: bool = False) -> None:
        """--log-keys: the keys read, per split, epoch and rank; a resumed part of an epoch appends."""
        if not self.cfg.run.log_keys:
            return
        folder = self.run_dir / "keys"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{split}-epoch{epoch:04d}-rank{self.info.rank}.txt", "a" if append else "w") as stream:
            stream.write("".join(k + "\n" for k in keys))

    # -- the run ------------------------------------------------------------------------------
    def write_config(self) -> None:
        if not self.info.is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        resolved = json.loads(self.cfg.to_json())
        resolved["derived"] = {
            "world_size": self.info.world,
            "global_batch": self.global_batch,
            "base_lr": self.base_lr,
            "train_shards": len(self.source.train_urls),
            "val_shards": len(self.source.val_urls),
            "train_samples": self.source.train_samples,
            "num_classes": self.source.num_classes,
            "epoch_batches": self.schedule.epoch_batches(self.start_epoch),
            "epochs": self.schedule.epochs,
            "total_batches": self.schedule.total,
            "device": str(self.info.device),
            "amp": str(self.amp),
        }
        (self.run_dir / "config.json").write_text(json.dumps(resolved, indent=1) + "\n")

    def run(self) -> dict:
        self.resume()
        self.write_config()
        last: dict = {}
        for epoch in range(self.start_epoch, self.schedule.epochs):
            started = time.time()
            record = {"epoch": epoch, **self.train_epoch(epoch)}
            if self.stop_position:
                self.stop(self.save(epoch - 1, self.stop_position), self.stop_position)
            if (epoch + 1) % self.cfg.run.eval_every == 0 or epoch + 1 == self.schedule.epochs:
                record.update(self.evaluate(epoch))
            if self.cfg.run.total_samples:
                done = min(self.schedule.total, (epoch + 1) * self.schedule.interval)
                record["samples_seen"] = done * self.global_batch
            record["replicas_in_sync"] = replicas_in_sync(self.model, self.optimizer, self.info)
            record["epoch_time_s"] = round(time.time() - started, 3)
            record["samples_per_s"] = round(record["train_samples"] / max(record["epoch_time_s"], 1e-9), 1)
            path = self.save(epoch)
            if self.info.is_main:
                with open(self.run_dir / "metrics.jsonl", "a") as stream:
                    stream.write(json.dumps(record) + "\n")
                print(_summary(record), flush=True)
                if self.events:
                    self.events.write(record, sum(self.schedule.epoch_batches(e) for e in range(epoch + 1)))
                if not record["replicas_in_sync"]:
                    log.error("replicas diverged at epoch %d: weights differ across ranks", epoch)
            self.mirror()
            last = record
            verdict, _ = self.vote.settle()  # a signal during evaluation or the checkpoint stops here
            if verdict.signum or self.stop_signal:
                self.stop(path, Position(epoch + 1), verdict.signum or self.stop_signal)
        if self.events:
            self.events.close()
        self.finish_uploads(self.cfg.data.io_timeout)
        for loader in (self.train_loader, self.val_loader):
            if loader:
                loader.close()
        return last

    def stop(self, path: Path | None, position: Position, signum: int = 0) -> NoReturn:
        """Leave after a pre-emption signal: the position is saved; results are flushed, briefly."""
        signum = signum or self.stop_signal
        if self.info.is_main:
            where = f"epoch {position.epoch} step {position.step}"
            print(
                f"stopped by {signal.Signals(signum).name} at {where}: checkpoint {path}; "
                "continue with --resume latest",
                flush=True,
            )
        self.mirror()
        self.finish_uploads(STOP_UPLOAD_S)
        raise Preempted(signum)

    def finish_uploads(self, timeout: float) -> None:
        """Wait (bounded) for the results mirror; files that did not reach the bucket are one error line."""
        if not self.uploader:
            return
        left = self.uploader.finish(timeout)
        if left:
            names = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
            raise ImagenetTrainError(
                f"--results {self.cfg.run.results}: {len(left)} files did not upload ({names}); they are in "
                f"{self.run_dir}, and --resume latest uploads them"
            )

    def mirror(self) -> None:
        """Start uploading what changed in the run directory (a no-op without --results)."""
        if self.uploader:
            self.uploader.sync()


def _summary(record: dict) -> str:
    parts = [f"epoch {record['epoch']}", f"loss {record['train_loss']:.4f}"]
    if "top1" in record:
        parts.append(f"top1 {record['top1']:.4f}")
    parts += [f"{record['samples_per_s']:.0f} img/s", f"{record['epoch_time_s']:.1f}s"]
    if record["corrupt_samples"]:
        parts.append(f"{record['corrupt_samples']} corrupt samples skipped")
    if record["broken_shards"]:
        parts.append(f"{record['broken_shards']} broken shards ({record['lost_samples']} samples lost)")
    return " | ".join(parts)


def train(cfg: Config) -> dict:
    """Run training on this rank as torchrun launched it; returns the last epoch's metrics.

    Raises Preempted after a clean stop on SIGTERM/SIGUSR1 (the CLI exits with 128 + the signal).
    """
    cfg.validate()
    request = StopRequest()
    request.install()  # before the first collective: a signal during start-up is noted, not fatal
    info = init_distributed()
    try:
        result = _run_released(cfg.for_world(info.world), info, request)
        if info.is_main:
            print(f"run directory: {Path(cfg.run.run_dir).resolve()}", flush=True)
        return result
    finally:
        cleanup()


def _run_released(cfg: Config, info: DistInfo, request: StopRequest) -> dict:
    """The run, with the trainer (its DDP model and loader processes) released before the caller tears down
    the process group, also when the run ends in an error or a pre-emption: torn down the other way round,
    a rank can block in its exit past the grace period."""
    source = run_source(cfg.data)
    trainer: Trainer | None = None
    failure: BaseException | None = None
    try:
        trainer = Trainer(cfg, info, source, request)  # DDP's constructor broadcasts: a peer can be lost here too
        return trainer.run()
    except (Preempted, ImagenetTrainError) as error:
        failure = error.with_traceback(None)  # the traceback holds the loop's frames and, in them, the loaders
        failure.__context__ = failure.__cause__ = None
    except Exception as error:
        if not is_peer_lost(error):
            raise
        log.debug("a collective failed", exc_info=error)
        failure = PeerLost(
            f"rank {info.rank}: another rank is gone ({peer_lost_reason(error)}); exit {PeerLost.exit_code} asks the "
            f"launcher to restart every node, which resumes from the last checkpoint with --resume latest"
        )
    finally:
        del trainer
        gc.collect()
    raise failure
