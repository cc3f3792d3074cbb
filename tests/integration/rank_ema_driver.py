"""A torchrun target for tests: `imagenet-train train ARGS...`, after which each rank writes its own EMA state to
RUN_DIR/ema-rank{R}.pt, so a test can compare the ranks' averages (only rank 0's reaches a checkpoint)."""

from __future__ import annotations

import sys

import torch

from imagenet_train.commands.train_cmd import train_config
from imagenet_train.main import train as main_train
from imagenet_train.main.entry_checks import runnable
from imagenet_train.training import loop


class EmaWritingTrainer(loop.Trainer):
    """The run's own Trainer; at the end each rank saves the EMA it would evaluate."""

    def run(self) -> dict:
        """Train as `train` does, then write this rank's EMA state."""
        record = super().run()
        assert self.ema is not None, "the driver needs --model-ema"
        torch.save(self.ema.state_dict(), self.dir.path / f"ema-rank{self.info.rank}.pt")
        return record


if __name__ == "__main__":
    main_train.Trainer = EmaWritingTrainer  # type: ignore[misc]
    main_train.train(runnable(train_config(sys.argv[1:])))
