"""Checkpoints written atomically (temp file, fsync, rename) and found again for --resume, and the run state
they hold.

A checkpoint holds tensors and plain data only (dicts, lists, strings, numbers), so it is read with
`torch.load(weights_only=True)`: a file planted in a run directory or a results bucket cannot run code, nor
make the load take memory out of all proportion to its size (weights_files.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import logging
import math
import re
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path, PurePath
from typing import Any, Protocol, TypeGuard

import numpy as np
import torch

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.atomic import atomic_write, free_space
from imagenet_train.io.owned import owned_folder
from imagenet_train.planning.position import MAX_EPOCH, Position
from imagenet_train.weights_files import read_torch_file

log = logging.getLogger(__name__)
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
    state = plain(state)
    writer = None
    try:
        owned_folder(path.parent)  # 0700 when made; another user's folder or link is one line
        with atomic_write(path, "wb", buffering=0, private=True) as raw:
            writer = _Writer(raw)
            # torch's stubs type the file as IO[bytes]; torch.save calls only write() and flush()
            torch.save(state, writer)  # type: ignore[arg-type]
    except (OSError, RuntimeError) as error:  # torch's zip writer reports a failed write as RuntimeError
        cause = writer.error if writer and writer.error else error
        reason = getattr(cause, "strerror", None) or str(cause).splitlines()[0][:120] or type(cause).__name__
        raise ImagenetTrainError(f"{path}: cannot write checkpoint ({reason}; {free_space(path.parent)})") from None


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


def newest(names: Iterable[str]) -> str | None:
    """The newest checkpoint name: the furthest epoch, and within it the furthest step (a whole epoch last)."""
    found = []
    for name in names:
        if match := _NAME.match(name):
            step = float("inf") if match.group(2) is None else int(match.group(2))
            found.append((int(match.group(1)), step, name))
    return max(found)[2] if found else None


def _held(run_dir: str) -> list[str]:
    folder = Path(run_dir) / "checkpoints"
    return sorted(path.name for path in folder.iterdir() if _NAME.match(path.name)) if folder.is_dir() else []


def latest(run_dir: str) -> Path | None:
    """The newest checkpoint in a run directory."""
    name = newest(_held(run_dir))
    return Path(run_dir) / "checkpoints" / name if name else None


def resume_path(resume: str, run_dir: str, rank: int, world: int) -> Path | None:
    """The checkpoint --resume names: for 'latest' the newest every rank holds (None: there is none), else the
    file given, which must exist."""
    if resume == "latest":
        return latest_on_every_rank(run_dir, rank, world)
    if not Path(resume).is_file():
        raise ImagenetTrainError(f"--resume: checkpoint {resume} does not exist")
    return Path(resume)


def latest_on_every_rank(run_dir: str, rank: int, world: int) -> Path | None:
    """The newest checkpoint that every rank's run directory holds, the same on all ranks.

    Nodes resume from their own run directories, filled from --results: a node restarted while rank 0's
    newest checkpoint was still uploading holds only an older one. Ranks that started from different
    checkpoints would run different numbers of steps (a hang or a lost peer) and train different weights.
    """
    held = _held(run_dir)
    if world > 1:
        gathered: list[list[str]] = [[] for _ in range(world)]
        torch.distributed.all_gather_object(gathered, held)
        common = newest(set.intersection(*(set(names) for names in gathered)))
        if newest(held) != common:
            log.warning(
                "rank %d holds %s, but not every rank does (a copy from --results not finished?): "
                "every rank resumes from %s",
                rank,
                newest(held),
                common or "the start",
            )
        held = [common] if common else []
    name = newest(held)
    return Path(run_dir) / "checkpoints" / name if name else None


_PLAIN = (str, int, float, bool, type(None), bytes, torch.Tensor)
CHECKPOINT_KEYS = ("epoch", "model", "optimizer", "scaler")


_LEAVES = (  # the types `plain` turns into a tensor, a number or a string
    (np.ndarray, lambda value: torch.from_numpy(np.ascontiguousarray(value))),
    (np.generic, lambda value: value.item()),
    (PurePath, str),
)


def _fields(value) -> dict | None:
    """An argparse result's or a dataclass instance's fields as a dict (None for anything else)."""
    if isinstance(value, argparse.Namespace):
        return vars(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return None


def plain(value, where: str = "checkpoint"):
    """`value` as tensors and plain data that `torch.load(weights_only=True)` reads back.

    Enums become their values, numpy arrays tensors, numpy scalars numbers, dataclasses, argparse results
    and sets plain dicts and lists, paths strings. Anything else is a TypeError naming where it is.
    """
    if isinstance(value, enum.Enum):
        return plain(value.value, where)
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, dict):  # OrderedDict too: module and optimizer state dicts keep their order
        kind = OrderedDict if isinstance(value, OrderedDict) else dict
        result = kind((plain(key, where), plain(item, f"{where}[{key!r}]")) for key, item in value.items())
        if isinstance(getattr(value, "_metadata", None), dict):  # a module state dict's per-module versions
            # torch sets _metadata on the OrderedDict a state dict is; the dict stubs lack that attribute
            result._metadata = plain(value._metadata, where)  # type: ignore[attr-defined]
        return result
    if isinstance(value, (list, tuple)):
        items = [plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)  # a namedtuple becomes a plain tuple
    if isinstance(value, (set, frozenset)):
        return sorted(plain(item, where) for item in value)
    for leaf, convert in _LEAVES:
        if isinstance(value, leaf):
            return convert(value)
    fields = _fields(value)
    if fields is not None:
        return plain(fields, where)
    raise TypeError(f"{where}: {type(value).__name__} is not tensors or plain data")


def load(path: Path) -> dict:
    """Read a checkpoint of this program onto the CPU (tensors and plain data only); else one error line."""
    state = read_torch_file(path, "checkpoint")
    if not isinstance(state, dict) or any(key not in state for key in CHECKPOINT_KEYS):
        raise ImagenetTrainError(
            f"{path}: not an imagenet-train checkpoint (expected the keys {', '.join(CHECKPOINT_KEYS)})"
        )
    return state


def prune_steps(run_dir: str, keep: Path) -> None:
    """Remove the mid-epoch checkpoints that `keep` supersedes (whole-epoch checkpoints all stay)."""
    folder = Path(run_dir) / "checkpoints"
    for path in folder.glob("epoch-*-step-*.pt"):
        if path != keep and _NAME.match(path.name):
            path.unlink(missing_ok=True)


def prune_epochs(run_dir: str, written: int, keep: int) -> list[Path]:
    """With `keep` (--keep-checkpoints) set, remove the whole-epoch checkpoints older than the newest `keep` up to
    epoch `written`, the one just written; never a newer one (a checkpoint this run did not write). Returns them."""
    if keep <= 0:
        return []
    folder = Path(run_dir) / "checkpoints"
    older = sorted((epoch, name) for name in _held(run_dir) if (epoch := _whole_epoch(name)) is not None)
    older = [(epoch, name) for epoch, name in older if epoch < written]
    gone = [folder / name for _, name in older[: max(0, len(older) - (keep - 1))]]
    for path in gone:
        path.unlink(missing_ok=True)
    return gone


def _whole_epoch(name: str) -> int | None:
    """The epoch of a whole-epoch checkpoint's name (None for a mid-epoch one)."""
    match = _NAME.match(name)
    return int(match.group(1)) if match and match.group(2) is None else None


class Stateful(Protocol):
    """Anything with torch's state-dict pair: a module, an optimizer, a grad scaler, an EMA."""

    def state_dict(self) -> dict:
        """The part's state, as tensors and plain data."""

    def load_state_dict(self, state: dict) -> Any:
        """Restore the part from what state_dict gave."""


class RunState:
    """What a checkpoint holds of a run: its parts' state dicts (model, optimizer, scaler, and whatever a hook
    adds, such as an EMA), plain facts about the run (schedule, config), and where in the run it was taken."""

    def __init__(self, run_dir: str | Path, parts: dict[str, Stateful], facts: dict[str, Any], keep: int = 0):
        self.run_dir, self.parts, self.facts = Path(run_dir), dict(parts), facts
        self.keep = keep  # --keep-checkpoints: whole-epoch checkpoints kept (0: all)
        self.optional: set[str] = set()

    def add(self, name: str, part: Stateful) -> None:
        """Save `part` with the rest; a checkpoint from a run without it resumes with `part` as it is."""
        self.parts[name] = part
        self.optional.add(name)

    def write(self, epoch: int, position: Position | None = None) -> Path:
        """Write the state after `epoch` completed, or at `position` inside the next epoch; prune older steps."""
        state = {
            "epoch": epoch,
            "position": position.to_dict() if position else None,
            **{name: part.state_dict() for name, part in self.parts.items()},
            **self.facts,
        }
        step = position.step if position else None
        path = checkpoint_path(str(self.run_dir), position.epoch if position else epoch, step)
        save(state, path)
        prune_steps(str(self.run_dir), keep=path)
        if step is None:  # only once the new epoch checkpoint is whole under its name
            prune_epochs(str(self.run_dir), epoch, self.keep)
        return path

    def restore(self, path: Path) -> tuple[int, Position | None]:
        """Load a checkpoint into the parts; returns the epoch to continue at and the position inside it.

        Its numbers are checked before any part is touched: a whole-number epoch and position in range, and
        finite optimizer settings (a NaN learning rate would train on silently)."""
        state = load(path)
        try:
            resumed: tuple[int, Position | None]
            if state.get("position"):
                position = Position.from_dict(state["position"])
                resumed = position.epoch, position
            else:
                epoch = state["epoch"]
                if type(epoch) is not int or not 0 <= epoch < MAX_EPOCH:
                    raise ValueError(f"epoch: expected a whole number from 0 to {MAX_EPOCH - 1}, not {str(epoch)[:40]}")
                resumed = epoch + 1, None
            _check_settings(state.get("optimizer"), self.parts.get("optimizer"))
            for name, part in self.parts.items():
                if name in state or name not in self.optional:
                    part.load_state_dict(state[name])
            return resumed
        except (KeyError, TypeError, ValueError, RuntimeError, OverflowError, IndexError) as error:
            # another model, or a hand-made file
            reason = str(error).strip().splitlines()[0][:120] if str(error).strip() else type(error).__name__
            raise ImagenetTrainError(f"{path}: checkpoint does not fit this run ({reason})") from None


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_settings(saved: object, current: Stateful | None) -> None:
    """ValueError unless each number the optimizer's parameter groups hold now (lr, momentum, betas, ...) comes
    back from the checkpoint as a finite number."""
    if current is None or not isinstance(saved, dict):
        return
    groups = saved.get("param_groups")
    groups = groups if isinstance(groups, list) else []
    for now, then in zip(current.state_dict().get("param_groups", []), groups, strict=False):
        for key, value in now.items():
            if not _number(value) and not (isinstance(value, tuple) and all(map(_number, value))):
                continue
            old = then.get(key) if isinstance(then, dict) else None
            values = old if isinstance(old, (list, tuple)) else [old]
            if not all(_number(v) and math.isfinite(v) for v in values) or len(values) != len(
                value if isinstance(value, tuple) else [value]
            ):
                raise ValueError(f"optimizer setting {key}: expected a finite number, not {str(old)[:40]}")
