"""P3: raw shard bytes over HTTP from a local nginx: the loaders' URL opener against curl, same files."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from imagenet_train.io import storage
from imagenet_train.ops.serve import NginxServer


def opener(urls: list[str], rounds: int) -> float:
    """Bytes/s reading every URL front to back with storage.open_stream (what ShardStream uses)."""
    total, start = 0, time.perf_counter()
    for _ in range(rounds):
        for url in urls:
            with storage.open_stream(url) as stream:
                while block := stream.read(1 << 20):
                    total += len(block)
    return total / (time.perf_counter() - start)


def curl(urls: list[str], rounds: int) -> float:
    """Bytes/s of one curl process fetching the same URLs to /dev/null (keep-alive, like our opener)."""
    command = ["curl", "-s", "--fail"]
    for url in urls * rounds:
        command += ["-o", "/dev/null", url]
    total = sum(int(u) for u in _sizes(urls)) * rounds
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return total / (time.perf_counter() - start)


def _sizes(urls: list[str]) -> list[str]:
    out = subprocess.run(
        ["curl", "-s", "--fail", "-I", *urls], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return [line.split(":", 1)[1].strip() for line in out if line.lower().startswith("content-length")]


def run(shards: Path, rounds: int = 5) -> dict:
    if not shutil.which("curl"):
        return {"skipped": "curl not installed"}
    tars = sorted(p.name for p in shards.glob("*.tar"))
    with NginxServer(str(shards)) as server:
        urls = [f"{server.url}/{name}" for name in tars]
        opener(urls, 1), curl(urls, 1)  # warm the page cache and nginx's open-file cache
        mb = sum((shards / name).stat().st_size for name in tars) * rounds / 1e6
        return {"megabytes": mb, "opener": opener(urls, rounds), "curl": curl(urls, rounds)}
