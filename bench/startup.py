"""P5: seconds from process start to the first batch, with 1,282 shards on the list (ImageNet's count at
1,000 images per shard), the index served by nginx."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.ops.serve import NginxServer

SHARDS = 1282

CHILD = """
import sys, time
from imagenet_train.datasets.source import resolve_source
from imagenet_train.loading.presets import TrainPreset
from imagenet_train.loading.stream import EpochLoader, ShardStream
source = resolve_source(sys.argv[1])
stream = ShardStream(urls=source.train_urls, transform=TrainPreset(224).build(), batch_size=64, resampled=True)
next(iter(EpochLoader(stream, int(sys.argv[2]), batches=10)))
print(time.time(), len(source.train_urls))
"""


def many_shards(images: Path, work: Path) -> Path:
    """The images as shards of 2 (or 1) so the index lists at least 1,282, trimmed to exactly that."""
    out = work / "startup-shards"
    if not (out / "shards.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        total = len(list((images / "train").rglob("*.JPEG")))
        per_shard = max(1, total // SHARDS)
        convert(str(images), str(out), ShardOptions(maxcount=per_shard, verify="header"), progress=False)
        index = json.loads((out / "shards.json").read_text())
        listed = index["splits"]["train"]["shardlist"]
        if len(listed) < SHARDS:
            raise RuntimeError(f"P5 needs {SHARDS} shards, the images make {len(listed)}")
        index["splits"]["train"]["shardlist"] = listed[:SHARDS]
        (out / "shards.json").write_text(json.dumps(index))
    return out


def run(images: Path, work: Path, workers: int, repeats: int = 3) -> dict:
    shards = many_shards(images, work)
    times = []
    with NginxServer(str(shards)) as server:
        for _ in range(repeats):
            start = time.time()
            out = subprocess.run(
                [sys.executable, "-c", CHILD, f"{server.url}/shards.json", str(workers)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            times.append(float(out[0]) - start)
            listed = int(out[1])
    return {"shards": listed, "seconds": sorted(times)[len(times) // 2], "all": times}
