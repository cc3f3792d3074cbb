"""The epoch boundary and the host side of a step on CPU, before and after: bench/stepoverhead.py run against
the package as it was at a git ref (default: main just before issue 16's input work) and this tree,
interleaved (before, after, before, after, ...) so both see the same machine; the best run of each counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# main just before b7b60bd (issue 16: persistent workers fed per-epoch state, no main-process restack,
# device copy one step ahead, cached normalisation constants, --decoder dali)
BEFORE = "fc37340"
WORKLOADS = {
    "demo": ["--arch", "resnet18", "--size", "32", "--batch", "32", "--epochs", "3", "--batches", "20"],
    "step224": ["--arch", "mobilenet_v3_small", "--size", "224", "--batch", "64", "--epochs", "2", "--batches", "10"],
}


def code_at(ref: str, work: Path) -> Path:
    """The package as it was at `ref`, extracted under `work`."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", ref], capture_output=True, text=True, check=True
    ).stdout.strip()
    target = work / f"code-{commit[:12]}"
    if not (target / "app").exists():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "app"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target / "app"


def measure(app: Path, shards: Path, workers: int, options: list[str]) -> dict:
    """bench/stepoverhead.py's figures with `app` as the package, and the load average around the run."""
    command = [sys.executable, str(REPO / "bench" / "stepoverhead.py"), str(shards), "--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": str(app), "OMP_NUM_THREADS": "1"}
    load = os.getloadavg()[0]
    done = subprocess.run([*command, *options], capture_output=True, text=True, env=env, timeout=900)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1][:200]}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "load": [round(load, 2), round(os.getloadavg()[0], 2)]}


def run(digit_shards: Path, bench_shards: Path, work: Path, workers: int, before: str, repeats: int = 2) -> dict:
    """Before/after, per workload: the digits demo (32 px) and 224-px steps on the benchmark JPEGs."""
    apps = {"before": code_at(before, work), "after": REPO / "app"}
    shards = {"demo": digit_shards, "step224": bench_shards}
    runs: dict[str, list[dict]] = {f"{name}_{when}": [] for name in WORKLOADS for when in apps}
    for _ in range(repeats):
        for name, options in WORKLOADS.items():
            for when, app in apps.items():
                runs[f"{name}_{when}"].append(measure(app, shards[name], workers, options))
                print(f"  {name} {when}: {json.dumps(runs[f'{name}_{when}'][-1])}", flush=True)
    best = {key: min(values, key=lambda x: x.get("outside_ms", float("inf"))) for key, values in runs.items()}
    commands = {name: " ".join(["bench/stepoverhead.py SHARDS", *options]) for name, options in WORKLOADS.items()}
    return {"before_ref": before, "workers": workers, "repeats": repeats, "commands": commands, **best, "runs": runs}
