"""examples/lightning_digits.py with rank 0's optimizer step held for a few seconds from its STEP-th step on:
it first touches the file $STOP_MARKER, so a test can send SIGTERM while rank 0 is inside `optimizer.step`
(Lightning's DDP starts rank 1 by running this driver again; only rank 0 is held)."""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

STEP = 3
HELD_S = 4.0
steps = 0


def hold_rank_0(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    """From the STEP-th step on, rank 0 marks that it is inside the step, then stays there for HELD_S."""
    global steps
    steps += 1
    if os.environ.get("LOCAL_RANK", "0") == "0" and steps >= STEP:
        Path(os.environ["STOP_MARKER"]).touch()
        time.sleep(HELD_S)


if __name__ == "__main__":
    register_optimizer_step_pre_hook(hold_rank_0)
    example = Path(__file__).resolve().parents[2] / "examples" / "lightning_digits.py"
    sys.argv[0] = __file__  # Lightning starts the other ranks with sys.argv: this driver again
    runpy.run_path(str(example), run_name="__main__")
