"""Checkpoints written atomically (temp file, fsync, rename) and found again for --resume."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from .errors import ImagenetTrainError

_NAME = re.compile(r"^epoch-(\d{4,})\.pt$")


def checkpoint_path(run_dir: str, epoch: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"epoch-{epoch:04d}.pt"


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
    """The checkpoint of the highest completed epoch in a run directory."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return max(found)[1] if found else None


def load(path: Path) -> dict:
    """Read a checkpoint onto the CPU; a broken file is an error naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise ImagenetTrainError(f"{path}: unreadable checkpoint ({type(error).__name__})") from None
