"""--model-ema: an exponential moving average of the weights (torch's AveragedModel, BN buffers included),
updated by a step hook, saved in every checkpoint, evaluated beside the model; and the run's final weights,
taken from whichever of the two scored the better top-1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.rundir import checkpoint
from imagenet_train.training.hooks import StepHook

PREFIX = "ema_"  # of the EMA's evaluation keys in the epoch record: ema_top1, ema_top5, ema_val_loss
FINAL = "final.pt"  # RUN_DIR/final.pt: the final weights as a plain state dict


def update_decay(decay: float, optimizer_batch: int, every: int, epochs: float) -> float:
    """The decay per EMA update for `decay` given per sample-epoch, as torchvision's reference adjusts it:
    1 - min(1, (1 - decay) x samples per update / epochs), where an update comes every `every` optimizer steps of
    `optimizer_batch` samples (over all ranks, --grad-accum-steps included) and `epochs` are data epochs (passes
    over the training set): the average then spans epochs / ((1 - decay) x training samples) of them."""
    return 1.0 - min(1.0, (1.0 - decay) * optimizer_batch * every / epochs)


class ModelEma(StepHook):
    """The EMA of a model's weights and buffers, updated after every `every`th optimizer step (timm's, one per
    optimizer step with gradient accumulation); during the first `warmup` loader steps of the run (the LR warmup)
    each update copies the weights instead of averaging them.

    One object serves the whole run: `at(first_step, steps)` tells it where the coming epoch starts in the run and
    how many loader steps it has, so it knows which steps end an accumulation group (Schedule.accumulation's)."""

    def __init__(self, model: torch.nn.Module, decay: float, every: int, warmup: int, accumulate: int = 1):
        self.model, self.every, self.warmup, self.accumulate = model, every, warmup, accumulate
        self.averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
        self.averaged.eval()
        self.offset = 0  # the run's step at the start of the current epoch
        self.steps = 0  # loader steps in the current epoch (0: not known; groups then end every `accumulate`)

    @property
    def module(self) -> torch.nn.Module:
        """The averaged copy of the model, for evaluation and the final weights."""
        return self.averaged.module

    def at(self, first_step: int, steps: int = 0) -> ModelEma:
        """This hook for an epoch of `steps` loader steps whose step 0 is the run's step `first_step`."""
        self.offset, self.steps = first_step, steps
        return self

    def after_step(self, step: int) -> bool:
        """Update the average after every `every`th optimizer step of the epoch; `step` loader steps are done."""
        ends_group = step % self.accumulate == 0 or step == self.steps  # an epoch's last group may be shorter
        if ends_group and -(-step // self.accumulate) % self.every == 0:
            self.averaged.update_parameters(self.model)
            if self.offset + step <= self.warmup:
                self.averaged.n_averaged.zero_()  # the next update copies again
        return False

    def state_dict(self) -> dict:
        """The averaged weights and buffers, and the number of updates averaged (for an exact resume)."""
        return self.averaged.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Continue from a checkpoint's EMA."""
        self.averaged.load_state_dict(state)


def run_ema(model: torch.nn.Module, optim: Any, schedule: Any) -> ModelEma | None:
    """A run's EMA under --model-ema (None without): the decay per update adjusted for the run's optimizer batch and
    length in data epochs (not loop epochs: --epoch-batches and --total-samples change those), copying during the
    LR warmup (its steps as Schedule.lr counts them). `optim` is config's OptimConfig,
    `schedule` the run's planning Schedule."""
    if not optim.model_ema:
        return None
    decay = update_decay(optim.model_ema_decay, schedule.optimizer_batch, optim.model_ema_steps, schedule.data_epochs)
    return ModelEma(model, decay, optim.model_ema_steps, schedule.warmup_steps, schedule.accumulate)


def ema_scores(record: dict) -> dict:
    """An evaluation record's scores under the EMA's keys (ema_top1, ema_top5, ema_val_loss)."""
    return {PREFIX + key: value for key, value in record.items() if key == "val_loss" or key.startswith("top")}


def ema_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The EMA's weights in a checkpoint of a --model-ema run, as a model's state dict; else one error line."""
    try:
        state = checkpoint.load_weights(path, entry="ema")
    except checkpoint.MissingEntry:
        raise ImagenetTrainError(
            f"--ema: {path} holds no EMA weights; expected a checkpoint of a run trained with --model-ema"
        ) from None
    return {key.removeprefix("module."): value for key, value in state.items() if key.startswith("module.")}
