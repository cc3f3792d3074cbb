"""Checkpoints written atomically (temp file, fsync, rename) and found again for --resume."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from .errors import ImagenetTrainError

_NAME = re.compile(r"^epoch-(\d{4,})(?:-step-(\d{6,}))?\.pt$")


def checkpoint_path(run_dir: str, epoch: int, step: int | None = None) -> Path:
    """`epoch-EEEE.pt` after a whole epoch, `epoch-EEEE-step-SSSSSS.pt` inside one."""
    suffix = "" if step is None else f"-step-{step:06d}"
    return Path(run_dir) / "checkpoints" / f"epoch-{epoch:04d}{suffix}.pt"


def save(state: dict, path: Path) -> None:
    """Write a checkpoint so that a crash never leaves a partial file under the final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(temporary, "wb") as stream:
        torch.save(state, stream)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, path)


def latest(run_dir: str) -> Path | None:
    """The newest checkpoint in a run directory: the furthest epoch, and within it the furthest step."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return None
    found = []
    for path in folder.iterdir():
        if match := _NAME.match(path.name):
            step = float("inf") if match.group(2) is None else int(match.group(2))  # a whole epoch comes last
            found.append((int(match.group(1)), step, path))
    return max(found)[2] if found else None


def load(path: Path) -> dict:
    """Read a checkpoint onto the CPU; a broken file is an error naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise ImagenetTrainError(f"{path}: unreadable checkpoint ({type(error).__name__})") from None


def prune_steps(run_dir: str, keep: Path) -> None:
    """Remove the mid-epoch checkpoints that `keep` supersedes (whole-epoch checkpoints all stay)."""
    folder = Path(run_dir) / "checkpoints"
    for path in folder.glob("epoch-*-step-*.pt"):
        if path != keep and _NAME.match(path.name):
            path.unlink(missing_ok=True)
