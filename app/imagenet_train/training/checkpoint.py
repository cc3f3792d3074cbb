"""Checkpoints written atomically (temp file, fsync, rename) and found again for --resume."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

import torch

from imagenet_train.errors import ImagenetTrainError

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
    writer = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb", buffering=0) as raw:
            writer = _Writer(raw)
            torch.save(state, writer)
            os.fsync(raw.fileno())
        os.replace(temporary, path)
    except (OSError, RuntimeError) as error:  # torch's zip writer reports a failed write as RuntimeError
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        cause = writer.error if writer and writer.error else error
        reason = getattr(cause, "strerror", None) or str(cause).splitlines()[0][:120] or type(cause).__name__
        raise ImagenetTrainError(f"{path}: cannot write checkpoint ({reason}; {_free(path.parent)})") from None


class _Writer:
    """The file torch.save writes to, keeping the operating system's error (torch's own message hides it)."""

    def __init__(self, raw):
        self.raw, self.error = raw, None

    def write(self, data) -> int:
        view = memoryview(data)
        try:
            while view:  # an unbuffered write may be short; ENOSPC comes as an OSError
                view = view[self.raw.write(view) :]
        except OSError as error:
            self.error = error
            raise
        return len(data)

    def flush(self) -> None:
        self.raw.flush()


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
