"""The epoch boundary and the host side of a step, before and after: bench/epochwait.py run against the
code this branch started from (`git merge-base HEAD main`... or REF) and against the working tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def code_at(ref: str, work: Path) -> Path:
    """The package as it was at `ref`, extracted under `work`."""
    target = work / f"code-{ref[:12]}"
    if not (target / "app").exists():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "app"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target / "app"


def measure(app: Path, shards: Path, arch: str, size: int, batch: int, workers: int, epochs: int, per: int) -> dict:
    """bench/epochwait.py's figures with `app` as the package."""
    command = [sys.executable, str(REPO / "bench" / "epochwait.py"), str(shards), arch, str(size), str(batch)]
    command += [str(workers), str(epochs), str(per)]
    env = {**os.environ, "PYTHONPATH": str(app), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(digit_shards: Path, bench_shards: Path, work: Path, workers: int, before: str) -> dict:
    """Before/after: the digits demo's epochs (first-batch wait) and 224-px steps (host overhead)."""
    apps = {"before": code_at(before, work), "after": REPO / "app"}
    result: dict = {"before_ref": before}
    for name, app in apps.items():
        result[f"demo_{name}"] = measure(app, digit_shards, "resnet18", 32, 32, workers, 3, 20)
        result[f"step224_{name}"] = measure(app, bench_shards, "mobilenet_v3_small", 224, 64, workers, 1, 10)
    return result
