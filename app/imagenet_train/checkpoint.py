"""Checkpoints written atomically (temp file, fsync, rename) and found again for --resume."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

import torch

from .errors import ImagenetTrainError

_NAME = re.compile(r"^epoch-(\d{4,})(?:-step-(\d{6,}))?\.pt$")


def checkpoint_path(run_dir: str, epoch: int, step: int | None = None) -> Path:
    """`epoch-EEEE.pt` after a whole epoch, `epoch-EEEE-step-SSSSSS.pt` inside one."""
    suffix = "" if step is None else f"-step-{step:06d}"
    return Path(run_dir) / "checkpoints" / f"epoch-{epoch:04d}{suffix}.pt"


def save(state: dict, path: Path) -> None:
    """Write a checkpoint so that a crash never leaves a partial file under the final name.

    A full or read-only run directory is one error naming the path and the free space; the previous
    checkpoint stays as it was and no partial file is left behind.
    """
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as stream:
            torch.save(state, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except (OSError, RuntimeError) as error:  # torch.save reports a failed write as RuntimeError
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        reason = getattr(error, "strerror", None) or _reason(error)
        raise ImagenetTrainError(f"{path}: cannot write checkpoint ({reason}; {_free(path.parent)})") from None


def _reason(error: BaseException) -> str:
    text = str(error)
    for known in ("No space left on device", "Read-only file system", "Permission denied", "Disk quota exceeded"):
        if known.lower() in text.lower() or "file write failed" in text:
            return known if known.lower() in text.lower() else "write failed (disk full?)"
    return text.splitlines()[0][:120] if text else type(error).__name__


def _free(folder: Path) -> str:
    """'N MB free on DIR' for the nearest existing folder."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return f"{shutil.disk_usage(folder).free / 1e6:.1f} MB free on {folder}"
    except OSError:
        return f"free space on {folder} unknown"


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
