"""Preflight: before a run bets GPU-weeks on its nodes, every rank checks what it will lean on: its device
computes a known product and has memory free, an all-reduce over the whole world reaches a bus bandwidth
floor, the shard index answers, and the run directory is writable with room for two checkpoints.

Every rank runs every check, then the ranks exchange their results (one all-gather of plain data), so each
failing rank is named with its host, and rank 0 writes the whole table to RUN_DIR/preflight.json. On a CPU the
CUDA checks are skipped with their reason and the all-reduce runs over gloo.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from imagenet_train.config import Config
from imagenet_train.errors import ImagenetTrainError, PreflightFailed, clip, one_line
from imagenet_train.training.dist import DistInfo

MATMUL_SIZE = 512  # a 512x512 product: milliseconds anywhere, and every tensor core path is exercised
BUSBW_BYTES = 64 << 20  # per all-reduce: past the latency-bound sizes on NVLink and InfiniBand alike
BUSBW_ROUNDS = 5  # timed, after one untimed warm-up
RECORD = "preflight.json"
INDEX_WAIT_S = 60.0  # a preflight is a one-shot check: an index that does not answer in a minute fails it
IMAGENET_CLASSES = 1000  # the head's size for the estimate when --num-classes leaves it to the index


@dataclass(frozen=True)
class Check:
    """One check on one rank: passed, failed (with why) or skipped (with why it could not run here)."""

    name: str
    ok: bool
    detail: str
    skipped: bool = False


def device_checks(device: torch.device) -> list[Check]:
    """The device computes a known product (against the CPU's) and reports its free memory."""
    if device.type != "cuda":
        why = "skipped: no CUDA device on this rank (CPU training)"
        return [Check("device", True, why, skipped=True), Check("memory", True, why, skipped=True)]
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator, dtype=torch.float64) for _ in range(2))
    expected = a @ b
    try:
        got = (a.to(device) @ b.to(device)).cpu()
        free, total = torch.cuda.mem_get_info(device)
    except RuntimeError as error:  # an Xid, an ECC error, a lost device: CUDA raises RuntimeError
        failed = f"{device} failed a {MATMUL_SIZE}x{MATMUL_SIZE} matmul ({one_line(str(error))})"
        return [Check("device", False, failed)]
    off = float((got - expected).abs().max())
    product = Check("device", off < 1e-6, f"{torch.cuda.get_device_name(device)}: float64 matmul off by {off:.1e}")
    memory = Check("memory", True, f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free")
    return [product, memory]


def bus_bandwidth(info: DistInfo, nbytes: int = BUSBW_BYTES, rounds: int = BUSBW_ROUNDS) -> float:
    """All-reduce bus bandwidth over the world in GB/s, as nccl-tests reports it: bytes x 2(n-1)/n per second."""
    tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=info.device)
    dist.all_reduce(tensor)  # warm-up: connections and buffers
    if info.device.type == "cuda":
        torch.cuda.synchronize(info.device)
    started = time.perf_counter()
    for _ in range(rounds):
        dist.all_reduce(tensor)
    if info.device.type == "cuda":
        torch.cuda.synchronize(info.device)
    seconds = (time.perf_counter() - started) / rounds
    return nbytes * 2 * (info.world - 1) / info.world / seconds / 1e9


def allreduce_check(info: DistInfo, floor_gbps: float) -> Check:
    """An all-reduce over every rank, its bus bandwidth measured against `floor_gbps` (0: reported only)."""
    if not info.enabled:
        return Check("all-reduce", True, "skipped: a single process has no peers", skipped=True)
    busbw = bus_bandwidth(info)
    ok = busbw >= floor_gbps
    floor = f" (floor {floor_gbps:g} GB/s)" if floor_gbps else ""
    return Check("all-reduce", ok, f"bus bandwidth {busbw:.2f} GB/s over {info.world} ranks{floor}")


def index_check(shards: str, io_timeout: float) -> Check:
    """The shard index answers within `io_timeout` and is a valid index."""
    if not shards:
        return Check("index", True, "skipped: no --shards (shard URLs given directly)", skipped=True)
    from imagenet_train.datasets.source import load_index

    started = time.perf_counter()
    try:
        index = load_index(shards, io_timeout=io_timeout)
    except ImagenetTrainError as error:
        return Check("index", False, one_line(str(error)))
    seconds = time.perf_counter() - started
    train = index.resolved.get("train", [])
    count = f"{len(train)} train shards" if train else "no train split"
    return Check("index", True, f"{clip(shards)} answered in {seconds:.2f} s: {count}")


def checkpoint_bytes(model: torch.nn.Module, state_copies: int) -> int:
    """A checkpoint's size: the model's parameters and buffers, `state_copies` times (optimizer state, EMA)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) * state_copies


def run_dir_check(run_dir: str, needed: int) -> Check:
    """The run directory takes a file, and its disk has room for two checkpoints of `needed` bytes."""
    try:
        os.makedirs(run_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".preflight-") as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
        free = shutil.disk_usage(run_dir).free
    except OSError as error:
        return Check("run-dir", False, f"{run_dir}: cannot write ({error.strerror})")
    wanted = 2 * needed
    detail = f"{run_dir}: {free / 2**30:.1f} GiB free, two checkpoints take {wanted / 2**30:.2f} GiB"
    return Check("run-dir", free >= wanted, detail)


def gathered(info: DistInfo, checks: list[Check]) -> list[dict]:
    """Every rank's host and checks, in rank order (plain data through the process group)."""
    mine = {"rank": info.rank, "host": socket.gethostname(), "checks": [asdict(check) for check in checks]}
    if not info.enabled:
        return [mine]
    everyone: list = [None] * info.world
    dist.all_gather_object(everyone, mine)
    return everyone


def failures(ranks: list[dict]) -> list[str]:
    """One line per failed check: 'preflight: rank R on HOST: CHECK failed: DETAIL'."""
    return [
        f"preflight: rank {rank['rank']} on {clip(rank['host'], 64)}: {check['name']} failed: {check['detail']}"
        for rank in ranks
        for check in rank["checks"]
        if not check["ok"]
    ]


def write_record(run_dir: str, ranks: list[dict]) -> str:
    """RUN_DIR/preflight.json: every rank's host and checks."""
    from imagenet_train.io.atomic import atomic_write

    path = os.path.join(run_dir, RECORD)
    verdict = "failed" if failures(ranks) else "passed"
    with atomic_write(path) as stream:
        stream.write(json.dumps({"verdict": verdict, "ranks": ranks}, indent=2).encode())
    return path


def estimated_checkpoint_bytes(cfg: Config) -> int:
    """An upper bound of one checkpoint: the model (built on the meta device, no memory) three times over for
    its weights and two optimizer moments, once more with EMA."""
    from imagenet_train.training.models import architecture

    with torch.device("meta"):
        model = architecture(cfg.run, cfg.data.num_classes or IMAGENET_CLASSES)
    return checkpoint_bytes(model, 3 + (1 if cfg.optim.model_ema else 0))


def run_preflight(cfg: Config, info: DistInfo) -> list[dict]:
    """Every check on this rank, every rank's results gathered; rank 0 writes RUN_DIR/preflight.json and prints
    them. Raises PreflightFailed on every rank when any rank failed a check (rank 0 names them all)."""
    checks = [
        *device_checks(info.device),
        allreduce_check(info, cfg.run.preflight_min_busbw),
        index_check(cfg.data.shards, min(cfg.loader.io_timeout, INDEX_WAIT_S)),
        run_dir_check(cfg.run.run_dir, estimated_checkpoint_bytes(cfg)),
    ]
    ranks = gathered(info, checks)
    lines = failures(ranks)
    if info.is_main:
        path = write_record(cfg.run.run_dir, ranks) if _writable(ranks) else "not written (the run directory failed)"
        for check in checks:
            print(f"preflight: rank 0: {check.name}: {check.detail}", flush=True)
        verdict = f"{len(lines)} check(s) failed" if lines else f"passed on {info.world} rank(s)"
        print(f"preflight: {verdict}; every rank's results: {path}", flush=True)
    if lines:
        raise PreflightFailed(lines if info.is_main else [])  # each failure printed once, by rank 0
    return ranks


def _writable(ranks: list[dict]) -> bool:
    return all(check["ok"] for check in ranks[0]["checks"] if check["name"] == "run-dir")
