"""The position key logs: which sample keys each rank fetched in each segment of an epoch, read back on a
mid-epoch resume to skip what a checkpoint already consumed (the arithmetic is planning/position.py's).

Each rank appends one line per batch it fetches, before the step runs, to
`RUN_DIR/position/epoch-EEEE/rank-RRRR-from-SSSSSS.keys` ("<batch index> <key> <key> ..."), where S is
the step the segment started at.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from imagenet_train.planning.position import Position, consumed_spans


def epoch_folder(run_dir: str | Path, epoch: int) -> Path:
    """The folder of one epoch's key logs."""
    return Path(run_dir) / "position" / f"epoch-{epoch:04d}"


class KeyLog:
    """This rank's log of fetched batches for one segment of one epoch."""

    def __init__(self, run_dir: str | Path, epoch: int, rank: int, start: int):
        folder = epoch_folder(run_dir, epoch)
        folder.mkdir(parents=True, exist_ok=True)
        self.stream: TextIO = open(folder / f"rank-{rank:04d}-from-{start:06d}.keys", "a")  # noqa: SIM115 (open all epoch)

    def fetched(self, index: int, keys: list[str]) -> None:
        """Record the sample keys of batch `index`, written out before its step runs."""
        # Flushed per batch: a SIGKILL loses nothing the OS already has.
        self.stream.write(f"{index} {' '.join(keys)}\n")
        self.stream.flush()

    def close(self) -> None:
        """Close the log file."""
        self.stream.close()


def consumed_keys(run_dir: str | Path, position: Position) -> set[str]:
    """Every key all ranks consumed in `position.epoch` before `position.step`, over all its segments."""
    folder = epoch_folder(run_dir, position.epoch)
    keys: set[str] = set()
    for start, stop in consumed_spans(position):
        for log in sorted(folder.glob(f"rank-*-from-{start:06d}.keys")):
            for line in log.read_text().splitlines():
                index, _, rest = line.partition(" ")
                if index.isdigit() and start <= int(index) < stop:
                    keys.update(rest.split())
    return keys
