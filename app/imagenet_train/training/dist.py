"""Distributed set-up from the torchrun contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from imagenet_train import waiting


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def enabled(self) -> bool:
        """Whether this is a distributed run (more than one rank)."""
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0."""
        return self.rank == 0


def init_distributed(timeout_minutes: float = 30.0) -> DistInfo:
    """Join the process group torchrun described (nccl on GPU, gloo on CPU), or use one that exists already.

    A launcher that sets up the group itself (Ray Train) leaves RANK/WORLD_SIZE unset: rank and world
    then come from the group, LOCAL_RANK from the environment.
    """
    existing = dist.is_initialized()
    rank = dist.get_rank() if existing else int(os.environ.get("RANK", 0))
    world = dist.get_world_size() if existing else int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world > 1 and not existing:
        _created.append(True)
        with waiting.blocking("joining the process group (the rendezvous)"):
            dist.init_process_group(
                backend="nccl" if device.type == "cuda" else "gloo",
                timeout=datetime.timedelta(minutes=timeout_minutes),
            )
    return DistInfo(rank, world, local_rank, device)


def all_sum(values: list[float], info: DistInfo) -> list[float]:
    """Element-wise sum of a short list of numbers over all ranks."""
    tensor = torch.tensor(values, dtype=torch.float64, device=info.device)
    if info.enabled:
        dist.all_reduce(tensor)
    return tensor.tolist()


def all_gather_numbers(values: list[float], info: DistInfo) -> list[list[float]]:
    """Every rank's list of numbers, in rank order."""
    tensor = torch.tensor(values, dtype=torch.float64, device=info.device)
    if not info.enabled:
        return [tensor.tolist()]
    gathered = [torch.zeros_like(tensor) for _ in range(info.world)]
    dist.all_gather(gathered, tensor)
    return [t.tolist() for t in gathered]


# Gloo reports a peer that closed its connections, or never answered, from its transport layer as a plain
# RuntimeError ("[.../gloo/transport/tcp/pair.cc:537] Read error ...: Connection reset by peer"); NCCL and the
# TCPStore raise torch's DistError family.
_GLOO_TRANSPORT = "gloo/transport/"


def is_peer_lost(error: BaseException) -> bool:
    """Whether a collective failed because another rank is gone, not because of anything on this rank."""
    if isinstance(error, dist.DistError):
        return True
    return type(error) is RuntimeError and _GLOO_TRANSPORT in str(error)


def peer_lost_reason(error: BaseException) -> str:
    """The backend's one-line reason, without its source location and its generic advice."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = text.split("] ", 1)[1] if text.startswith("[") and "] " in text else text
    return text.split(". This is typically caused by", 1)[0].rstrip(".")


def cleanup() -> None:
    """Leave the process group, if this module created it (a launcher's own group is the launcher's)."""
    if _created and dist.is_initialized():
        dist.destroy_process_group()
        _created.clear()


_created: list = []  # [True] while a group init_distributed created is open
