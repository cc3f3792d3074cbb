"""Where training stands inside an epoch, so a run killed mid-epoch resumes without repeating or
skipping a sample.

Each rank logs the batches it fetches, one segment per start of the epoch (training/key_log.py): a run
resumed at step S of an epoch starts a new segment at S. A checkpoint taken at step S counts as consumed
exactly the batches of each segment whose index lies before the next segment's start (or S), on every
rank: no collective is needed, so ranks that already left a Join are counted too.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
        """The position that `to_dict` wrote (an older checkpoint may lack world and samples_left)."""
        return cls(
            int(data["epoch"]),
            int(data["step"]),
            [int(s) for s in data["segments"]],
            int(data.get("world", 0)),
            int(data.get("samples_left", 0)),
        )


def consumed_spans(position: Position) -> list[tuple[int, int]]:
    """Per segment, its start and the batch index it stops counting at: the next segment's start, or the step."""
    return list(zip(position.segments, [*position.segments[1:], position.step], strict=True))
