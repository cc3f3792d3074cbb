"""Checkpoints written atomically (temp file, fsync, rename) and found again for --resume, and the run state
they hold.

A checkpoint holds tensors and plain data only (dicts, lists, strings, numbers), so it is read with
`torch.load(weights_only=True)`: a file planted in a run directory or a results bucket cannot run code.

Nor can it make the load take memory out of all proportion to its size. A torch file is a zip archive, and
torch writes every record in it stored, uncompressed; torch.load would inflate a deflated record all the
same (a 1.9 MB file to a 2.3 GB tensor). So before loading, the archive's directory is read: a compressed
record, a record that claims more bytes than it occupies or lies outside the file, or records that add up to
more than the file itself (MAX_INFLATION) are refused in one line naming the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import logging
import math
import pickle
import re
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path, PurePath
from typing import Any, Protocol

import numpy as np
import torch

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.atomic import atomic_write, free_space
from imagenet_train.planning.position import MAX_EPOCH, Position

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
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path, "wb", buffering=0) as raw:
            writer = _Writer(raw)
            torch.save(state, writer)
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
            result._metadata = plain(value._metadata, where)
        return result
    if isinstance(value, (list, tuple)):
        items = [plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)  # a namedtuple becomes a plain tuple
    if isinstance(value, (set, frozenset)):
        return sorted(plain(item, where) for item in value)
    for kind, convert in _LEAVES:
        if isinstance(value, kind):
            return convert(value)
    fields = _fields(value)
    if fields is not None:
        return plain(fields, where)
    raise TypeError(f"{where}: {type(value).__name__} is not tensors or plain data")


def load(path: Path) -> dict:
    """Read a checkpoint of this program onto the CPU (tensors and plain data only); else one error line."""
    state = _read(path, "checkpoint")
    if not isinstance(state, dict) or any(key not in state for key in CHECKPOINT_KEYS):
        raise ImagenetTrainError(
            f"{path}: not an imagenet-train checkpoint (expected the keys {', '.join(CHECKPOINT_KEYS)})"
        )
    return state


class MissingEntry(ImagenetTrainError):
    """A weights file without the checkpoint entry asked for."""


def load_weights(path: str | Path, entry: str = "model") -> dict[str, torch.Tensor]:
    """Model weights from a file: a state dict of tensors, or a checkpoint's `entry` ('model', or 'ema' where a
    run kept one); else one error line."""
    state = _read(Path(path), "weights file")
    if isinstance(state, dict) and isinstance(state.get(entry), dict):
        state = state[entry]
    elif entry != "model":
        raise MissingEntry(f"{path}: no '{entry}' entry; expected a checkpoint that holds one")
    if (
        not isinstance(state, dict)
        or not state
        or not all(isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in state.items())
    ):
        raise ImagenetTrainError(f"{path}: expected a state dict of tensors (or a checkpoint with a 'model' entry)")
    return dict(state)


MAX_INFLATION = 1.0  # a checkpoint's records add up to at most this times its file size (torch stores them)
_LEGACY_MAGIC = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19."  # pickled torch.serialization.MAGIC_NUMBER


def check_archive(path: Path, what: str = "checkpoint") -> None:
    """Refuse a torch zip file whose records are compressed or add up to more than the file holds."""
    try:
        size = path.stat().st_size
        if not zipfile.is_zipfile(path):
            with open(path, "rb") as stream:
                legacy = stream.read(len(_LEGACY_MAGIC)) == _LEGACY_MAGIC
            if legacy:  # its pickle declares each storage's size, allocated before the bytes are read
                raise ImagenetTrainError(
                    f"{path}: a {what} in torch's legacy (before 1.6) format, whose sizes cannot be checked before "
                    "loading; refused (re-save it with torch.save where it is trusted)"
                )
            return  # not a torch file: torch.load refuses it in one line
    except OSError:
        return  # torch.load says what is wrong with it, in one line
    except zipfile.BadZipFile:  # is_zipfile found an end record it could not read (a damaged ZIP64 locator)
        raise ImagenetTrainError(f"{path}: unreadable {what} (a damaged zip directory: BadZipFile)") from None
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except Exception as error:  # zipfile raises many kinds for a damaged directory (NotImplementedError too)
        reason = f"a damaged zip directory: {type(error).__name__}"
        raise ImagenetTrainError(f"{path}: unreadable {what} ({reason})") from None
    total = 0
    for record in records:
        name = record.filename[:80]
        if record.compress_type != zipfile.ZIP_STORED:
            raise ImagenetTrainError(
                f"{path}: {what} record {name} is stored compressed ({record.compress_size} bytes inflating to "
                f"{record.file_size}); torch writes records uncompressed, so this file was made to inflate, refused"
            )
        if record.file_size != record.compress_size or record.header_offset + record.compress_size > size:
            raise ImagenetTrainError(
                f"{path}: {what} record {name} claims {record.file_size} bytes that the {size}-byte file does not "
                "hold; refused"
            )
        total += record.file_size
    if total > MAX_INFLATION * size:
        raise ImagenetTrainError(
            f"{path}: {what} records add up to {total} bytes, more than {MAX_INFLATION:g}x the file's {size}; refused"
        )


def _read(path: Path, what: str):
    """torch.load with weights_only=True: a file that needs anything beyond tensors and plain data, or that would
    inflate past its size, is refused."""
    check_archive(path, what)
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols on stderr: the error says it all
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "GLOBAL " in str(error):  # a torch file that needs Python classes or functions to load
            raise ImagenetTrainError(_untrusted(path, what, str(error))) from None
        raise ImagenetTrainError(f"{path}: unreadable {what} (not a torch file of tensors and plain data)") from None
    except FileNotFoundError:
        raise ImagenetTrainError(f"{path}: no such {what}") from None
    except Exception as error:
        raise ImagenetTrainError(f"{path}: unreadable {what} ({type(error).__name__})") from None


def _untrusted(path: Path, what: str, message: str) -> str:
    """The one line for a file holding Python objects: what it is, and how to convert it if it is trusted."""
    found = re.search(r"GLOBAL (\S+)", message)
    named = f", such as {found.group(1).strip('`,.')[:80]}" if found else ""
    recipe = (
        "import torch; from imagenet_train.rundir.checkpoint import plain; "
        f"p = {str(path)!r}; torch.save(plain(torch.load(p, map_location='cpu', weights_only=False)), p)"
    )
    return (
        f"{path}: this {what} holds Python objects beyond tensors and plain data{named}; loading them could run "
        f'code, so it is refused. Only if you trust the file, convert it once with: python -c "{recipe}"'
    )


def prune_steps(run_dir: str, keep: Path) -> None:
    """Remove the mid-epoch checkpoints that `keep` supersedes (whole-epoch checkpoints all stay)."""
    folder = Path(run_dir) / "checkpoints"
    for path in folder.glob("epoch-*-step-*.pt"):
        if path != keep and _NAME.match(path.name):
            path.unlink(missing_ok=True)


class Stateful(Protocol):
    """Anything with torch's state-dict pair: a module, an optimizer, a grad scaler, an EMA."""

    def state_dict(self) -> dict:
        """The part's state, as tensors and plain data."""

    def load_state_dict(self, state: dict) -> Any:
        """Restore the part from what state_dict gave."""


class RunState:
    """What a checkpoint holds of a run: its parts' state dicts (model, optimizer, scaler, and whatever a hook
    adds, such as an EMA), plain facts about the run (schedule, config), and where in the run it was taken."""

    def __init__(self, run_dir: str | Path, parts: dict[str, Stateful], facts: dict[str, Any]):
        self.run_dir, self.parts, self.facts = Path(run_dir), dict(parts), facts
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
        return path

    def restore(self, path: Path) -> tuple[int, Position | None]:
        """Load a checkpoint into the parts; returns the epoch to continue at and the position inside it.

        Its numbers are checked before any part is touched: a whole-number epoch and position in range, and
        finite optimizer settings (a NaN learning rate would train on silently)."""
        state = load(path)
        try:
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


def _number(value: object) -> bool:
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
