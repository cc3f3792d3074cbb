"""A loader worker's steady state per image, part by part: CPU microseconds (this process's user + system time, so
other tenants' load counts less than in wall time) of the default decode and crop, the fused decoder's, the decode
alone, and the per-sample share of the shard's sha256 and of the tar reader, over the bench's shards, one thread,
parts interleaved round by round (best of the rounds).

    python bench/image_parts.py bench/.work/shards [--images 300 --rounds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import simplejpeg
import torch

from imagenet_train.datasets.source import resolve_source
from imagenet_train.io import tarstream
from imagenet_train.loading.presets import TrainPreset


def cpu_us(fn: Callable, items: Sequence) -> float:
    """CPU microseconds per item of `fn` over `items`."""
    start = time.process_time()
    for item in items:
        fn(item)
    return (time.process_time() - start) / len(items) * 1e6


def run(shards: Path, images: int = 300, rounds: int = 3) -> dict:
    """Each part's CPU microseconds per image (per sample for the shard-wide parts), every round and the best."""
    torch.set_num_threads(1)
    blobs = [Path(url).read_bytes() for url in resolve_source(str(shards)).train_urls]
    jpegs = [data for blob in blobs for name, data in tarstream.members(io.BytesIO(blob)) if name.endswith(".jpg")]
    per_sample = len(blobs) / len(jpegs)  # the shard-wide parts, spread over the samples
    parts: dict[str, tuple[Callable, Sequence, float]] = {
        "simplejpeg decode + RandomResizedCrop + flip (the default)": (TrainPreset(224).build(), jpegs[:images], 1),
        "fused: header, box, lossless crop, DCT-scaled decode, resize, flip": (
            TrainPreset(224, decoder="fused").build(),
            jpegs[:images],
            1,
        ),
        "simplejpeg decode alone (whole image)": (simplejpeg.decode_jpeg, jpegs[:images], 1),
        "sha256 of the shard's bytes (--verify-shards)": (lambda b: hashlib.sha256(b).digest(), blobs, per_sample),
        "tar reader (tarstream)": (lambda b: sum(1 for _ in tarstream.members(io.BytesIO(b))), blobs, per_sample),
    }
    for fn, items, _ in parts.values():
        fn(items[0])  # warm-up: libraries loaded, first allocations made
    figures: dict[str, list[float]] = {name: [] for name in parts}
    load = os.getloadavg()[0]
    for _ in range(rounds):
        for name, (fn, items, scale) in parts.items():
            figures[name].append(round(cpu_us(fn, items) * scale, 1))
    return {
        "images": min(images, len(jpegs)),
        "mean_jpeg_kb": round(sum(map(len, jpegs)) / len(jpegs) / 1e3, 1),
        "load": [round(load, 2), round(os.getloadavg()[0], 2)],
        "rounds": figures,
        "best_us": {name: min(values) for name, values in figures.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", type=Path)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(json.dumps(run(args.shards, args.images, args.rounds), indent=1))


if __name__ == "__main__":
    main()
