"""Where training stands inside an epoch, so a run killed mid-epoch resumes without repeating or
skipping a sample.

Each rank appends one line per batch it fetches, before the step runs, to
`RUN_DIR/position/epoch-EEEE/rank-RRRR-from-SSSSSS.keys` ("<batch index> <key> <key> ..."). A run
resumed at step S of an epoch starts a new segment file `from-S`. A checkpoint taken at step S counts
as consumed exactly the lines of each segment whose index lies before the next segment's start (or
S), on every rank: no collective is needed, so ranks that already left a Join are counted too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO


@dataclass
class Position:
    """An epoch, the global step inside it, and the step each earlier segment of the epoch started at."""

    epoch: int
    step: int = 0
    segments: list[int] = field(default_factory=lambda: [0])
    world: int = 0  # ranks when the checkpoint was taken
    samples_left: int = 0  # resampled mode: samples the interrupted epoch still owed

    def to_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "segments": list(self.segments),
            "world": self.world,
            "samples_left": self.samples_left,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Position:
        return cls(
            int(data["epoch"]),
            int(data["step"]),
            [int(s) for s in data["segments"]],
            int(data.get("world", 0)),
            int(data.get("samples_left", 0)),
        )


def epoch_folder(run_dir: str | Path, epoch: int) -> Path:
    return Path(run_dir) / "position" / f"epoch-{epoch:04d}"


class KeyLog:
    """This rank's log of fetched batches for one segment of one epoch."""

    def __init__(self, run_dir: str | Path, epoch: int, rank: int, start: int):
        folder = epoch_folder(run_dir, epoch)
        folder.mkdir(parents=True, exist_ok=True)
        self.stream: TextIO = open(folder / f"rank-{rank:04d}-from-{start:06d}.keys", "a")  # noqa: SIM115 (open all epoch)

    def fetched(self, index: int, keys: list[str]) -> None:
        # Flushed per batch: a SIGKILL loses nothing the OS already has.
        self.stream.write(f"{index} {' '.join(keys)}\n")
        self.stream.flush()

    def close(self) -> None:
        self.stream.close()


def consumed_keys(run_dir: str | Path, position: Position) -> set[str]:
    """Every key all ranks consumed in `position.epoch` before `position.step`, over all its segments."""
    folder = epoch_folder(run_dir, position.epoch)
    bounds = [*position.segments[1:], position.step]
    keys: set[str] = set()
    for start, stop in zip(position.segments, bounds, strict=True):
        for log in sorted(folder.glob(f"rank-*-from-{start:06d}.keys")):
            for line in log.read_text().splitlines():
                index, _, rest = line.partition(" ")
                if index.isdigit() and start <= int(index) < stop:
                    keys.update(rest.split())
    return keys
