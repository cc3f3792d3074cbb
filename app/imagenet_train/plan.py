"""Epoch, shard and batch arithmetic shared by the loaders, the loop and the planner. No torch, no I/O."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ImagenetTrainError


def assigned(items: Sequence, index: int, count: int) -> list:
    """Every `count`-th item starting at `index`: how shards split over ranks, then over workers."""
    return list(items[index::count])


def epoch_order(nshards: int, seed: int, epoch: int) -> list[int]:
    """Shard order for one epoch: a permutation identical on every rank, different every epoch."""
    order = list(range(nshards))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def worker_shards(order: Sequence[int], rank: int, world: int, worker: int, workers: int) -> list[int]:
    """The shards one DataLoader worker of one rank reads in split mode (ranks first, then workers)."""
    return assigned(assigned(order, rank, world), worker, workers)


def loader_workers(nshards_for_rank: int, workers: int) -> int:
    """DataLoader workers worth starting: never more than the rank has shards (idle workers fail)."""
    return max(0, min(workers, nshards_for_rank))


def resampled_epoch_batches(total_samples: int, batch_size: int, world_size: int) -> int:
    """Batches per rank per epoch when shards are resampled: one pass over the data in total."""
    batches = total_samples // (batch_size * world_size)
    if batches < 1:
        raise ImagenetTrainError(
            f"epoch length: {total_samples} samples cannot fill one batch of {batch_size} on each of "
            f"{world_size} ranks; lower --batch-size or pass --epoch-batches"
        )
    return batches


@dataclass(frozen=True)
class RankSplit:
    """What one rank reads in one epoch of split mode."""

    rank: int
    shards: tuple[int, ...]
    samples: int
    workers: int
    batches: int


def split_epoch(
    shard_sizes: Sequence[int], world: int, workers: int, batch_size: int, seed: int = 0, epoch: int = 0
) -> list[RankSplit]:
    """Per-rank shards, samples and batches for one split-mode epoch (partial batches kept per worker)."""
    order = epoch_order(len(shard_sizes), seed, epoch)
    ranks = []
    for rank in range(world):
        mine = assigned(order, rank, world)
        nworkers = loader_workers(len(mine), workers)
        batches = 0
        for worker in range(max(nworkers, 1)):
            samples = sum(shard_sizes[s] for s in assigned(mine, worker, max(nworkers, 1)))
            batches += math.ceil(samples / batch_size)
        ranks.append(
            RankSplit(
                rank=rank,
                shards=tuple(mine),
                samples=sum(shard_sizes[s] for s in mine),
                workers=nworkers,
                batches=batches,
            )
        )
    return ranks


def lr_at(step: int, total_steps: int, warmup_steps: int, base_lr: float, final_lr: float = 0.0) -> float:
    """Learning rate at a global step: linear warmup from ~0, then cosine decay to `final_lr`."""
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return final_lr + 0.5 * (base_lr - final_lr) * (1 + math.cos(math.pi * progress))
