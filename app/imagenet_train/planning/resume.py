"""How a rank starts an epoch: from its beginning, or inside it where a checkpoint left off.

Pure arithmetic on the checkpoint's position, the mode and the world; the trainer applies the answer to its
loader (and, in the exact modes, reads which samples the position consumed).
"""

from __future__ import annotations

from dataclasses import dataclass

from imagenet_train.choices import Mode
from imagenet_train.planning.position import Position


@dataclass(frozen=True)
class EpochStart:
    """What the trainer sets on its loader before an epoch, and the position its key logs and checkpoints use."""

    position: Position  # where the epoch starts; resuming, the checkpoint's step opens a new segment
    batches: int | None  # the loader's batch limit for what is left (None: until the data runs out)
    resumed_from: Position | None = None  # the checkpoint's own position, when resuming inside this epoch
    skip_consumed: bool = False  # exact modes: skip the samples `resumed_from` consumed
    resume_tag: str = ""  # resampled mode: draws of a resumed part differ from the interrupted part's
    world_changed: bool = False  # resuming with another number of ranks than the checkpoint had


def epoch_start(
    saved: Position | None,
    epoch: int,
    mode: Mode,
    world: int,
    batch_size: int,
    epoch_batches: int,
    split_cut: int = 0,
) -> EpochStart:
    """Where `epoch` starts on `world` ranks, given the position a checkpoint saved (if any).

    `epoch_batches` is the schedule's batches per rank for the epoch (resampled mode); `split_cut` is
    --epoch-batches, which cuts a split-mode epoch (0: not cut).
    """
    cut = split_cut if mode == Mode.SPLIT and split_cut else 0
    if saved is None or saved.epoch != epoch:
        saved = Position(epoch)
    step = saved.step
    if not step:
        return EpochStart(saved, epoch_batches if mode == Mode.RESAMPLED else cut or None)
    changed = bool(saved.world and saved.world != world)
    position = Position(epoch, step, [*saved.segments, step])
    if mode == Mode.RESAMPLED:
        # With another world the per-rank count is re-derived from the samples the epoch still owed.
        left = saved.samples_left // (batch_size * world) if changed else epoch_batches - step
        return EpochStart(position, left, saved, resume_tag=f":resume{step}", world_changed=changed)
    return EpochStart(position, cut - step if cut else None, saved, skip_consumed=True, world_changed=changed)
