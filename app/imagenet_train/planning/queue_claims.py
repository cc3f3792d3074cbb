"""Queue mode's claims as arithmetic: which shards each DataLoader worker of each rank reads when every worker
reads at the same pace. The loader claims at run time, so a faster rank takes more; this is the even case the
planner shows and the schedule counts an epoch by. No torch, no I/O."""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def queue_first_shard(rank: int, world: int, worker: int, workers: int) -> int:
    """Queue mode: the position in the epoch's order a worker reads before it claims any, its first in split
    mode. Claims hand out the positions from `world * workers` on, so every worker of every rank has a shard
    however fast its peers start."""
    return worker * world + rank


def equal_pace_claims(order: Sequence[int], sizes: Sequence[int], world: int, workers: int) -> list[list[list[int]]]:
    """[rank][worker] -> the shards (indices into `sizes`) it reads, in the order read, when every worker reads
    one sample per turn: a worker claims the next position of `order` when its shard runs dry, and workers that
    run dry on the same turn claim in (rank, worker) order, an empty shard's claimer claiming again at once."""
    workers = max(workers, 1)
    read: list[list[list[int]]] = [[[] for _ in range(workers)] for _ in range(world)]
    dry: list[tuple[int, int]] = []  # (the turn its shard runs dry, slot): the heap's order is the claims' order
    for slot in range(world * workers):
        rank, worker = divmod(slot, workers)
        position = queue_first_shard(rank, world, worker, workers)
        if position < len(order):
            read[rank][worker].append(order[position])
            dry.append((sizes[order[position]], slot))
    heapq.heapify(dry)
    claimed = world * workers
    while dry:
        turn, slot = heapq.heappop(dry)
        if claimed >= len(order):
            continue  # the queue is empty: this worker's stream ends
        rank, worker = divmod(slot, workers)
        read[rank][worker].append(order[claimed])
        heapq.heappush(dry, (turn + sizes[order[claimed]], slot))
        claimed += 1
    return read
