"""Where training stands inside an epoch, so a run killed mid-epoch resumes without repeating or
skipping a sample.

Each rank logs the batches it fetches, one segment per start of the epoch (rundir/directory.py): a run
resumed at step S of an epoch starts a new segment at S. A checkpoint taken at step S counts as consumed
exactly the batches of each segment whose index lies before the next segment's start (or S), on every
rank: no collective is needed, so ranks that already left a Join are counted too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Bounds for a position read back from a checkpoint (a file that may come from a bucket): far beyond any run.
MAX_EPOCH = 1_000_000
MAX_STEP = 1 << 40
MAX_SEGMENTS = 10_000
MAX_WORLD = 1 << 20


@dataclass
class Position:
    """An epoch, the global step inside it, and the step each earlier segment of the epoch started at."""

    epoch: int
    step: int = 0
    segments: list[int] = field(default_factory=lambda: [0])
    world: int = 0  # ranks when the checkpoint was taken
    samples_left: int = 0  # resampled mode: samples the interrupted epoch still owed

    def to_dict(self) -> dict:
        """The position as plain JSON values, for a checkpoint."""
        return {
            "epoch": self.epoch,
            "step": self.step,
            "segments": list(self.segments),
            "world": self.world,
            "samples_left": self.samples_left,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Position:
        """The position that `to_dict` wrote (an older checkpoint may lack world and samples_left); ValueError
        naming the field unless every number is a whole number in range and the segments fit the step."""
        if not isinstance(data, dict):
            raise ValueError("position: expected a mapping")
        segments = data.get("segments")
        if not isinstance(segments, list) or not 1 <= len(segments) <= MAX_SEGMENTS:
            raise ValueError(f"position: segments: expected a list of 1 to {MAX_SEGMENTS} steps")
        position = cls(
            _whole(data.get("epoch"), "epoch", MAX_EPOCH),
            _whole(data.get("step"), "step", MAX_STEP),
            [_whole(s, "segments", MAX_STEP) for s in segments],
            _whole(data.get("world", 0), "world", MAX_WORLD),
            _whole(data.get("samples_left", 0), "samples_left", MAX_STEP),
        )
        steps = [*position.segments, position.step]
        if any(a > b for a, b in zip(steps, steps[1:], strict=False)):
            raise ValueError("position: segments: expected steps in order, none past the step")
        return position


def _whole(value: object, name: str, most: int) -> int:
    """`value` when it is a whole number from 0 to `most` (True and 2.0 are not); else ValueError naming it."""
    if type(value) is not int or not 0 <= value <= most:
        raise ValueError(f"position: {name}: expected a whole number from 0 to {most}, not {str(value)[:40]}")
    return value


def consumed_spans(position: Position) -> list[tuple[int, int]]:
    """Per segment, its start and the batch index it stops counting at: the next segment's start, or the step."""
    return list(zip(position.segments, [*position.segments[1:], position.step], strict=True))
