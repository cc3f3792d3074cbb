"""Keeping every rank's replica identical: after Join, the momentum and the EMA of a rank that ran every step are
copied to all; once per epoch a cheap checksum compare, reported as `replicas_in_sync` in metrics.jsonl."""

from __future__ import annotations

import torch
import torch.distributed as dist

from imagenet_train.training.dist import DistInfo, all_gather_numbers


def sync_optimizer_state(
    optimizer: torch.optim.Optimizer, batches: int, info: DistInfo, ema: torch.nn.Module | None = None
) -> None:
    """After Join, copy momentum, and the EMA when there is one, from a rank that ran every step (`batches`:
    this rank's steps).

    Join's DDP hook syncs the parameters from the last joiner; optimizer state on ranks that
    joined early is stale and would make the replicas drift apart from the next step on. Their EMA
    missed the updates of the steps they sat out: without the copy each rank would evaluate its
    own average (ema_top1) while rank 0's alone is saved.
    """
    counts = [int(c[0]) for c in all_gather_numbers([batches], info)]
    source = max(rank for rank, count in enumerate(counts) if count == max(counts))
    if ema is not None:
        for tensor in ema.state_dict().values():  # weights, buffers and the count of updates averaged
            dist.broadcast(tensor, src=source)
    # Walk the parameters, not the state: a rank that has not stepped yet (queue mode can leave it
    # without a shard) has no momentum buffers, and every rank must make the same broadcasts.
    for group in optimizer.param_groups:
        if not group["momentum"]:
            continue
        for parameter in group["params"]:
            state = optimizer.state[parameter]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(parameter)
            dist.broadcast(state["momentum_buffer"], src=source)


def replicas_in_sync(model: torch.nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> bool:
    """Whether every rank holds the same weights and momentum (a cheap checksum compare)."""
    if not info.enabled:
        return True
    total = sum(p.detach().double().sum().item() for p in model.parameters())
    total += sum(
        v.double().sum().item()
        for s in optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.dtype.is_floating_point
    )
    sums = [s[0] for s in all_gather_numbers([total], info)]
    return max(sums) - min(sums) <= 1e-6 * max(1.0, abs(sums[0]))
