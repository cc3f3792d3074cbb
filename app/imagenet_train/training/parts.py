"""What the trainer is handed rather than builds: its batches (loading/batches.py's RunBatches) and its run
directory (rundir/directory.py's RunDirectory), as the trainer uses them. main/train.py builds both, as
torchvision's main() builds the loaders that train_one_epoch gets; training/ imports neither package, so the
loop, the loaders and the run directory stand side by side."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from imagenet_train.config import Config
from imagenet_train.datasets.source import DataSource
from imagenet_train.planning.position import Position
from imagenet_train.planning.schedule import Schedule
from imagenet_train.training.dist import DistInfo
from imagenet_train.training.hooks import KeyLogFile

DeviceBatch = tuple[torch.Tensor, torch.Tensor, list[str]]  # images and labels on the device, sample keys


class Loader(Protocol):
    """One split's epoch loader (loading/stream.py's EpochLoader)."""

    batches: int | None

    def start_epoch(
        self, epoch: int, skip_keys: Iterable[str] = (), resume_tag: str = "", batches: int | None = None
    ) -> None:
        """Set up the next epoch, or what is left of it."""

    def damage(self) -> tuple[int, int, int]:
        """(corrupt samples, broken shards, lost samples) met so far."""
        ...

    def outages(self) -> tuple[int, float]:
        """(I/O retries, seconds in outages) met so far."""
        ...

    def epoch_report(self) -> dict[str, int]:
        """What the coming epoch's record says about its loading."""
        ...


class Batches(Protocol):
    """The run's train and val batches on the device. Read-only members, so that RunBatches, whose loaders are
    EpochLoaders, satisfies them."""

    @property
    def train(self) -> Loader:
        """The train loader."""
        ...

    @property
    def val(self) -> Loader | None:
        """The val loader (None: no val split)."""
        ...

    def train_batches(self) -> Iterable[DeviceBatch]:
        """The epoch's train batches."""
        ...

    def val_batches(self) -> Iterable[DeviceBatch]:
        """The val batches."""
        ...

    def abandon(self) -> None:
        """Drop the loaders at once (a stop while waiting)."""

    def close(self) -> None:
        """Shut the loaders down."""


class Saved(Protocol):
    """What a checkpoint holds a part of: torch's state-dict pair (a module, an optimizer, a scaler, an EMA)."""

    def state_dict(self) -> dict:
        """The part's state."""
        ...

    def load_state_dict(self, state: dict) -> object:
        """Restore the part."""


class Checkpoints(Protocol):
    """The run's checkpoints (rundir/checkpoint.py's RunState)."""

    def add(self, name: str, part: Saved) -> None:
        """Save and restore one more part (the EMA)."""

    def write(self, epoch: int, position: Position | None = None) -> Path:
        """A checkpoint after `epoch` (inside the next one at `position`)."""
        ...

    def restore(self, path: Path) -> tuple[int, Position | None]:
        """Load `path`; the epoch to continue at and the position inside it."""
        ...


class EpochLines(Protocol):
    """metrics.jsonl and the tracker (rundir/run_record.py's EpochRecords; rank 0)."""

    def write(self, record: dict, global_step: int) -> None:
        """One epoch's line."""

    def keep_before(self, epoch: int) -> None:
        """Drop the lines from `epoch` on (they are trained again after a resume)."""

    def close(self) -> None:
        """End the tracker's run."""


class Mirror(Protocol):
    """The copy of RUN_DIR to --results (rundir/results_mirror.py's ResultsMirror)."""

    def fetch_for_resume(self, say: bool) -> None:
        """Fetch the run's checkpoints from --results first."""

    def sync(self) -> None:
        """Start copying what changed."""

    def finish(self, timeout: float, stoppable: bool = True) -> None:
        """Wait up to `timeout` for the copies."""


class RunFiles(Protocol):
    """RUN_DIR on one rank: checkpoints (`state`), the epochs' lines (`records`, rank 0, else None) and the
    mirror to --results (`mirror`). Read-only members, so that RunDirectory's own classes satisfy them."""

    @property
    def path(self) -> Path:
        """RUN_DIR."""
        ...

    @property
    def state(self) -> Checkpoints:
        """The checkpoints."""
        ...

    @property
    def records(self) -> EpochLines | None:
        """The epochs' lines (rank 0, else None)."""
        ...

    @property
    def mirror(self) -> Mirror:
        """The copy to --results."""
        ...

    def checkpoint_for(self, resume: str, rank: int, world: int) -> Path | None:
        """The checkpoint --resume names, or None."""
        ...

    def consumed_keys(self, position: Position) -> frozenset[str]:
        """The keys read up to `position` in its epoch."""
        ...

    def key_log(self, epoch: int, rank: int, start: int) -> KeyLogFile:
        """The epoch's position key log of this rank, from step `start`."""
        ...

    def write_keys(self, split: str, epoch: int, rank: int, keys: list[str], append: bool = False) -> None:
        """--log-keys: the keys this rank read in a split's epoch."""

    def write_final(self, state: dict[str, torch.Tensor]) -> Path:
        """RUN_DIR/final.pt."""
        ...

    def begin(
        self, cfg: Config, info: DistInfo, schedule: Schedule, source: DataSource, amp: torch.dtype | None, epoch: int
    ) -> None:
        """Rank 0: config.json and the tracker's run."""


@dataclass(frozen=True)
class RunParts:
    """How the trainer gets its batches and run directory, once its schedule and model exist: `batches(source,
    steps, length)` (the first epoch's batches and the ramp's data epoch, in epochs) and `directory(saved, facts)`
    (what the checkpoints hold, and what they record of the schedule and the config)."""

    batches: Callable[[DataSource, int, float], Batches]
    directory: Callable[[dict[str, Saved], dict[str, object]], RunFiles]
