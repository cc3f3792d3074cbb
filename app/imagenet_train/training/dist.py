"""Distributed set-up from the torchrun contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)."""

from __future__ import annotations

import datetime
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from imagenet_train import waiting
from imagenet_train.limits import COLLECTIVE_TIMEOUT


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


def init_distributed(timeout_s: float = COLLECTIVE_TIMEOUT, run_dir: str = "") -> DistInfo:
    """Join the process group torchrun described (nccl on GPU, gloo on CPU), or use one that exists already.

    A launcher that sets up the group itself (Ray Train) leaves RANK/WORLD_SIZE unset: rank and world
    then come from the group, LOCAL_RANK from the environment. `timeout_s` bounds every collective
    (--collective-timeout); on GPU, NCCL's watchdog and flight recorder are switched on first (`nccl_environment`).
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
        if device.type == "cuda":
            nccl_environment(os.environ, timeout_s, run_dir)
        _created.append(True)
        with waiting.blocking("joining the process group (the rendezvous)"):
            dist.init_process_group(
                backend="nccl" if device.type == "cuda" else "gloo",
                timeout=datetime.timedelta(seconds=timeout_s),
            )
    return DistInfo(rank, world, local_rank, device)


FLIGHT_RECORDER = "flight-recorder"  # the run directory's folder for NCCL's dumps, one file per rank
TRACE_ENTRIES = 20000  # collectives the flight recorder keeps per rank (a few MB of host memory); torch's own is 2000


def nccl_environment(env: MutableMapping[str, str], timeout_s: float, run_dir: str) -> dict[str, str]:
    """Switch on PyTorch's NCCL watchdog, its heartbeat monitor and flight recorder, dumping into RUN_DIR/
    flight-recorder/ on a timeout; set before the process group exists (NCCL reads them then), and only where
    the operator's environment has not set them already. Returns what was set."""
    folder = Path(run_dir or ".") / FLIGHT_RECORDER
    wanted = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # a timed-out collective aborts the communicator and the process
        "TORCH_NCCL_ENABLE_MONITORING": "1",  # the heartbeat monitor: a watchdog stuck in CUDA/NCCL ends the process
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(max(60, int(timeout_s))),
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(TRACE_ENTRIES),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{folder.resolve()}/rank-",  # torch appends the rank
    }
    chosen = {name: value for name, value in wanted.items() if name not in env}
    if "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" in chosen:
        folder.mkdir(parents=True, exist_ok=True)
    env.update(chosen)
    return chosen


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


def is_collective_timeout(error: BaseException) -> bool:
    """Whether a collective failed because a peer did not answer within the process group's timeout (gloo: "Timed
    out waiting Nms for recv operation to complete"; NCCL's watchdog: "... timed out" / "timeout")."""
    text = str(error).lower()
    return is_peer_lost(error) and ("timed out" in text or "timeout" in text)


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
