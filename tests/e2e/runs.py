"""What the end-to-end tests run and read back: the values of a run, the bucket's results, the report's rows."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from imagebuild import IMAGE_REPOSITORY, NGINX_STANDIN

from imagenet_train.io import gcs

BUCKET = "e2e"
SHARDS = f"gs://{BUCKET}/shards"
RUNS = f"gs://{BUCKET}/runs"
# SMALL_TRAIN (tests/conftest.py) as the chart's `train:` values, one loader worker per rank on 2 cores.
SMALL = {
    "arch": "resnet18",
    "train_crop_size": 32,
    "val_resize_size": 32,
    "val_crop_size": 32,  # torchvision's 224 by default since 49d9966: a resize of 32 is refused under it
    "batch_size": 32,
    "workers": 1,
    "hflip": False,
    "shuffle_buffer": 200,
    "resume": "latest",
}
NVIDIA_STANDIN = "nvidia_entrypoint.sh (stand-in): CUDA forward compatibility checked"


def values(kind: str, source: str, run: str, emulator: str, epochs: int, elastic: bool = False, **train) -> dict:
    """A release's values: 2 nodes x 1 CPU process, the stand-in images, results in the bucket."""
    repository, tag = NGINX_STANDIN.rsplit(":", 1)
    shards = (
        {
            "server": "nginx",
            "nginx": {
                "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                "volume": {"size": "1Gi"},
                "fill": {"enabled": True, "from": SHARDS, "parallel": 4},
            },
        }
        if source == "nginx"
        else {"server": "bucket", "bucket": {"url": SHARDS}}
    )
    return {
        "image": {"repository": IMAGE_REPOSITORY, "tag": "image-test", "pullPolicy": "Never"},
        "launcher": {
            "kind": kind,
            "nodes": 2,
            "nprocPerNode": 1,
            "waitForShardsSeconds": 300,
            "elastic": {"enabled": elastic, "minNodes": 1, "maxNodes": 2, "maxRestarts": 3},
        },
        "train": {**SMALL, "epochs": epochs, **train},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "3Gi", "nvidia.com/gpu": None}},
        "shmSize": "512Mi",
        # The trainers reach the bucket emulator through the chart's `env:`; one math thread per rank on 2 cores.
        "env": [
            {"name": "STORAGE_EMULATOR_HOST", "value": emulator},
            {"name": "OMP_NUM_THREADS", "value": "1"},
            {"name": "LOGLEVEL", "value": "INFO"},
        ],
        "results": {"bucket": RUNS, "runName": run},
        "shards": shards,
    }


def bucket_files(run: str) -> dict[str, int]:
    """The run's objects in the results bucket: name (below the run) -> size."""
    below = f"runs/{run}/"
    return {info.name[len(below) :]: info.size for info in gcs.listing(f"gs://{BUCKET}/{below}", io_timeout=30)}


def bucket_metrics(run: str) -> list[dict]:
    """metrics.jsonl of the run, read from the results bucket."""
    data = gcs.client().bucket(BUCKET).blob(f"runs/{run}/metrics.jsonl").download_as_bytes()
    return [json.loads(line) for line in data.decode().splitlines()]


@dataclass
class Row:
    """One line of docs/e2e.md: a launcher and shard source run end to end (or a fault), and what came of it."""

    launcher: str
    source: str
    case: str  # "run + resume" or the fault
    outcome: str  # Succeeded / Failed (and the reason)
    epochs: str = ""  # e.g. "2 + resumed 1"
    top1: float | None = None
    bucket: str = ""  # what is in the results bucket
    resumed: str = ""
    seconds: float = 0.0
    events: list[str] = field(default_factory=list)
    semantics: str = ""  # faults: what the chart renders for them
    expected: str = ""  # faults: the outcome those semantics must give
    test: str = ""

    def as_json(self) -> str:
        return json.dumps(asdict(self))


def report_path(base: Path) -> Path:
    """E2E_REPORT, or e2e.jsonl in pytest's base temp directory."""
    return Path(os.environ.get("E2E_REPORT") or base / "e2e.jsonl")


class Clock:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self) -> float:
        return round(time.monotonic() - self.start, 1)


class MidRun:
    """The fault of one test: once rank 0 wrote the first epoch's metrics (its checkpoint is on its way to the
    bucket) and `delay` seconds more passed (early in epoch 1), SIGKILL a pod's main process (a crash, an OOM
    kill) or evict the pod (SIGTERM, its grace period, the DisruptionTarget condition: a drain, a pre-emption)."""

    def __init__(self, run: str, target: str, action: str, delay: float = 5):
        self.run, self.target, self.action, self.delay = run, target, action, delay
        self.armed_at = 0.0
        self.done = ""

    def __call__(self, controller) -> None:
        if self.done:
            return
        pods = {pod.name: pod for pod in controller.current() if pod.phase == "Running"}
        if not self.armed_at:
            if any((p.root / "volumes" / "results" / self.run / "metrics.jsonl").exists() for p in pods.values()):
                self.armed_at = time.monotonic()
            return
        if time.monotonic() - self.armed_at < self.delay or self.target not in pods:
            return
        pod, kubelet = pods[self.target], controller.kubelet
        if self.action == "kill":
            kubelet.signal(pod, "KILL")
        else:
            kubelet.delete(pod, disruption=True)
        self.done = f"{self.action} {self.target} at {time.strftime('%H:%M:%S')}"
        controller.outcome.note(self.done)
