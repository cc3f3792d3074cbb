"""Lightning: a LightningDataModule over our shard loaders and a LightningModule with our model and recipe.

The data module hands Lightning plain iterables, not DataLoaders, so Lightning never injects its own
DistributedSampler: each rank reads its shards through our ShardStream, and resampled mode gives every
rank exactly the same number of batches (checked by the planner before the first batch). Split and queue
modes give ranks uneven batch counts that only Join can even out; Lightning's loop does not run Join,
so they are refused.
"""

# ruff: noqa: E402 (torchvision must be made importable before Lightning loads it)
from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import torch

from imagenet_train.compat import ensure_torchvision

ensure_torchvision()  # Lightning imports torchvision (through torchmetrics) as it loads

import lightning

from imagenet_train.choices import Mode
from imagenet_train.config import Config
from imagenet_train.datasets.source import run_source
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.loading.batches import train_loader, val_loader
from imagenet_train.loading.stream import EpochLoader
from imagenet_train.main.entry_checks import runnable
from imagenet_train.planning.plan import preflight_check
from imagenet_train.planning.schedule import Schedule
from imagenet_train.training import models
from imagenet_train.training.batch_input import normalize
from imagenet_train.training.evaluation import Totals
from imagenet_train.training.hooks import StepHook
from imagenet_train.training.optimizers import build_optimizer
from imagenet_train.training.progress import RunProgress
from imagenet_train.training.step import build_criterion, seed_augmentation


def refuse_uneven_modes(cfg: Config) -> None:
    """Only resampled mode gives every rank equal batches without Join; say so for the others."""
    mode = cfg.loader.mode
    if mode != Mode.RESAMPLED:
        raise ImagenetTrainError(
            f"--mode {mode}: cannot run under Lightning (its uneven batches per rank need Join, which Lightning's "
            f"loop does not run); use --mode resampled with Lightning, or `imagenet-train train` for --mode {mode}"
        )


def refuse_train_only_settings(cfg: Config) -> None:
    """The recipe settings only `imagenet-train train` applies, refused rather than silently left out."""
    optim, run = cfg.optim, cfg.run
    wanted = {
        "--model-ema": optim.model_ema,
        "--mixup-alpha": cfg.augment.mixup_alpha > 0,
        "--cutmix-alpha": cfg.augment.cutmix_alpha > 0,
        "--val-tta": run.val_tta,
        "--grad-accum-steps": optim.grad_accum_steps > 1,
        "--sync-bn": run.sync_bn,
        "--tracker": run.tracker != "none",  # Lightning has its own loggers (MLFlowLogger, WandbLogger)
    }
    given = [name for name, on in wanted.items() if on]
    if given:
        raise ImagenetTrainError(f"{', '.join(given)}: not applied under Lightning; use `imagenet-train train`")


class EpochBatches:
    """An EpochLoader as Lightning sees it: a sized iterable that reads the trainer's current epoch."""

    def __init__(self, loader: EpochLoader, trainer: lightning.Trainer):
        self.loader, self.trainer = loader, trainer

    def __len__(self) -> int:
        if self.loader.batches is None:  # split and queue modes, which Lightning does not run (refuse_uneven_modes)
            raise TypeError("an epoch without a batch count has no length")  # len()'s error for an unsized object
        return self.loader.batches

    def __iter__(self) -> Iterator:
        self.loader.set_epoch(self.trainer.current_epoch)
        return iter(self.loader)


class ShardDataModule(lightning.LightningDataModule):
    """Training and validation batches from a shard index (or URL spec), one share per rank."""

    def __init__(self, cfg: Config):
        super().__init__()
        cfg = runnable(cfg)
        refuse_uneven_modes(cfg)
        refuse_train_only_settings(cfg)
        self.cfg = cfg
        self.source = run_source(cfg.data, cfg.loader.io_timeout)
        self.schedule: Schedule | None = None
        self.train_batches: EpochLoader | None = None
        self.val_batches: EpochLoader | None = None

    def setup(self, stage: str) -> None:
        """Check the launch with the planner and build this rank's loaders."""
        trainer = self.attached()
        world = trainer.world_size
        preflight_check(self.cfg, self.source.train_sizes, world)
        self.schedule = Schedule.of(self.cfg, self.source.train_samples, self.source.train_sizes, world)
        rank, device = trainer.global_rank, trainer.strategy.root_device
        # Every rank built the model from the same seed; from here each crops differently, as under `train`.
        seed_augmentation(self.cfg.run.seed, rank)
        self.train_batches = train_loader(self.cfg, rank, world, device, self.source, self.schedule.epoch_batches(0))
        self.val_batches = val_loader(self.cfg, rank, world, device, self.source)

    def attached(self) -> lightning.Trainer:
        """The Trainer this module is attached to (Lightning attaches it before setup)."""
        if self.trainer is None:
            raise RuntimeError("ShardDataModule is not attached to a Trainer")  # as LightningModule.trainer says
        return self.trainer

    def train_dataloader(self) -> EpochBatches:
        """This rank's training batches, of the Trainer's current epoch each time they are iterated."""
        if self.train_batches is None:
            raise RuntimeError("ShardDataModule.train_dataloader before setup")
        return EpochBatches(self.train_batches, self.attached())

    def val_dataloader(self) -> EpochLoader | list:
        """This rank's validation batches (none without a validation split)."""
        return self.val_batches or []


class TrainJobProgress(lightning.Callback):
    """The TrainJob's progress (Kubeflow Trainer's status endpoint), posted by rank 0 as `train` posts it
    (training/progress.py): after steps, at most every few seconds, at each epoch's end with its loss and
    validation scores, and 100% once fit ends well, early or not; nothing without the Trainer's variables.
    ImagenetModule brings it, made for itself, to every Trainer."""

    def __init__(self, module: ImagenetModule) -> None:
        self.module = module
        self.run: RunProgress | None = None
        self.epoch: StepHook = StepHook()
        self.started, self.batches = 0.0, 0  # when this epoch started here, and the batches it has run since

    def on_fit_start(self, trainer: lightning.Trainer, module: lightning.LightningModule) -> None:
        """Rank 0 finds the endpoint (the schedule gives the run's length in steps)."""
        self.run = RunProgress.of(self.module.schedule, trainer.is_global_zero)

    def on_train_epoch_start(self, trainer: lightning.Trainer, module: lightning.LightningModule) -> None:
        """This epoch's share of the report."""
        if self.run is not None:  # set by on_fit_start, which Lightning calls first
            self.epoch, self.started, self.batches = self.run.at(trainer.current_epoch), time.monotonic(), 0

    def on_train_batch_end(
        self, trainer: lightning.Trainer, module: lightning.LightningModule, outputs: object, batch: object, index: int
    ) -> None:
        """Report the steps done (when due)."""
        self.batches += 1
        self.epoch.after_step(index + 1)

    def on_train_epoch_end(self, trainer: lightning.Trainer, module: lightning.LightningModule) -> None:
        """After the epoch's validation (Lightning validates before this hook): post with its metrics, the
        scores only when this epoch was validated (callback_metrics keeps the last validation's)."""
        epoch, loss = trainer.current_epoch, trainer.callback_metrics.get("train_loss")
        record: dict = {"epoch": epoch, **({"train_loss": float(loss)} if loss is not None else {})}
        history = self.module.history
        if history and history[-1]["epoch"] == epoch:
            record.update(history[-1])
        elapsed = time.monotonic() - self.started
        if elapsed > 0:  # the batches run, not the epoch's: max_steps or max_time may end it part way
            record["samples_per_s"] = self.batches * self.module.schedule.global_batch / elapsed
        if self.run is not None:
            self.run.epoch_end(epoch, record)

    def on_fit_end(self, trainer: lightning.Trainer, module: lightning.LightningModule) -> None:
        """A fit that ended well is done even before its last epoch (EarlyStopping, max_time, max_steps): post 100%
        unless that epoch's end did. Lightning calls this only when fit returns, never after an exception."""
        if self.run is not None:
            self.run.end()


class StopAtBatchEnd(lightning.Callback):
    """SIGTERM ends the fit at the end of a training batch, on every rank at once, wherever it lands.

    Lightning's own handler runs a collective (a broadcast) inside the signal handler: landing in the middle of
    the step (`optimizer.step`, DDP's backward), that broadcast meets another rank's unrelated one, fails, and
    its error surfaces from wherever the handler interrupted, a traceback from torch/optim and exit 1. Here the
    handler only notes the signal (and passes it to the ranks this process started, as Lightning's does); each
    batch's end asks every rank with one small all-reduce, and all of them raise Lightning's SIGTERMException
    there together. ImagenetModule brings it to every Trainer."""

    def __init__(self) -> None:
        self.trainer: lightning.Trainer | None = None
        self.noted = 0  # the stop signal this rank received (0: none)

    def on_train_start(self, trainer: lightning.Trainer, module: lightning.LightningModule) -> None:
        """Take SIGTERM over from Lightning's handler (its teardown puts back what was there before the fit)."""
        self.trainer = trainer
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.note)

    def note(self, signum: int, _frame: object) -> None:
        """The handler: note the signal and pass it on to the ranks this process started; no collective here."""
        first, self.noted = not self.noted, signum
        launcher = self.trainer.strategy.launcher if self.trainer else None
        if first and launcher is not None and hasattr(launcher, "kill"):
            launcher.kill(signum)

    def on_train_batch_end(
        self, trainer: lightning.Trainer, module: lightning.LightningModule, outputs: object, batch: object, index: int
    ) -> None:
        """Stop every rank here when any rank has noted a stop signal."""
        if self.agreed(trainer):
            raise lightning.pytorch.utilities.exceptions.SIGTERMException(128 + signal.SIGTERM)

    def agreed(self, trainer: lightning.Trainer) -> bool:
        """Whether any rank has noted a stop (every rank calls this at the same batch: it is a collective)."""
        if trainer.world_size == 1 or not torch.distributed.is_initialized():
            return bool(self.noted)
        flag = torch.tensor([1.0 if self.noted else 0.0], device=trainer.strategy.root_device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())


class ImagenetModule(lightning.LightningModule):
    """The model, SGD parameter groups, warmup+cosine LR per step, loss and top-1/top-5 of `imagenet-train train`."""

    def __init__(self, cfg: Config, num_classes: int):
        super().__init__()
        self.cfg = cfg
        torch.manual_seed(cfg.run.seed)
        # Lightning sets `rank` on its rank_zero_only function at import; its stubs lack the attribute.
        rank = lightning.pytorch.utilities.rank_zero_only.rank  # type: ignore[attr-defined]
        self.model = models.create(cfg.run, num_classes, rank == 0)
        self.criterion = build_criterion(cfg.optim)
        self.num_classes = num_classes
        self.totals = Totals(num_classes, torch.device("cpu"))
        self.history: list[dict] = []  # per-epoch validation metrics, identical on every rank

    @property
    def schedule(self) -> Schedule:
        """The run's LR and batch schedule, made by the data module's setup."""
        return self.trainer.datamodule.schedule  # type: ignore[attr-defined]  # set by fit; Trainer's stubs lack it

    def setup(self, stage: str) -> None:
        """The LR schedule spans --epochs: the Trainer must run exactly as many."""
        if self.trainer.max_epochs != self.schedule.epochs:
            raise ImagenetTrainError(
                f"Trainer(max_epochs={self.trainer.max_epochs}): must be {self.schedule.epochs}, the run's --epochs"
            )

    def configure_callbacks(self) -> list[lightning.Callback]:
        """The TrainJob's progress and a clean stop, whichever Trainer runs the module."""
        return [TrainJobProgress(self), StopAtBatchEnd()]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The run's --opt over the model's parameter groups, starting at the schedule's base LR."""
        return build_optimizer(self.cfg.optim, self.model, self.schedule.base_lr)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        """One batch's training loss, with the learning rate set for this step."""
        images, labels, _ = batch
        lr = self.schedule.lr(self.current_epoch, batch_idx, self.schedule.epoch_batches(self.current_epoch))
        for group in self.trainer.optimizers[0].param_groups:  # the one configure_optimizers returns
            group["lr"] = lr
        loss = self.criterion(self.model(normalize(images, False)), labels)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(labels))
        self.log("lr", lr, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(labels))
        return loss

    def on_validation_epoch_start(self) -> None:
        """Zero the validation totals."""
        self.totals = Totals(self.num_classes, self.device)

    def validation_step(self, batch, batch_idx: int) -> None:
        """Add one batch's loss, top-1 and top-k hits and sample count to the validation totals."""
        images, labels, _ = batch
        self.totals.add(self.model(normalize(images, False)), labels)

    def on_validation_epoch_end(self) -> None:
        """Log the epoch's validation loss and accuracy over all ranks, and append them to `history`."""
        sums = torch.cat([self.totals.sums, self.totals.sums.new_tensor([self.totals.count])])
        loss, top1, topk, count = self.trainer.strategy.reduce(sums, reduce_op="sum").tolist()
        if self.trainer.sanity_checking or count == 0:
            return
        metrics = self.totals.scores(loss, top1, topk, count)
        self.log_dict(metrics, sync_dist=True)  # the same numbers on every rank: the mean changes nothing
        self.history.append({"epoch": self.current_epoch, **metrics, "val_samples": int(count)})
