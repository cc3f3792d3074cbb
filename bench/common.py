"""Shared pieces of the benchmarks: an ImageNet-like JPEG set, timing, and the machine's description."""

from __future__ import annotations

import io
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

SIDE = (500, 375)  # ImageNet's typical landscape size
QUALITY = 90
NOISE = 20.0  # sensor-like grain; sets the compressed size near ImageNet's


def imagenet_like(
    root: Path, count: int, classes: int = 10, seed: int = 0, short_sides: tuple[int, int] | None = None
) -> Path:
    """`count` JPEGs of 500x375 at quality 90 in ImageFolder layout, cut from real photos (scikit-learn's
    sample images) with random crops, flips, colour shifts and sensor-like noise so they compress like
    ImageNet photos (~110 KB). Reused when already there.

    `short_sides` (low, high): each image 4:3 with its short side drawn log-uniformly in that range instead,
    with the same grain per pixel (so bytes grow with pixels, ~0.55 B/pixel)."""
    stamp = root / "DONE.json"
    recipe = {"count": count, **({"short_sides": list(short_sides)} if short_sides else {})}
    if stamp.exists() and {k: v for k, v in json.loads(stamp.read_text()).items() if k != "mean_bytes"} == recipe:
        return root
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    sizes = []
    for index in range(count):
        photo = photos[index % len(photos)]
        height, width = photo.shape[:2]
        side = SIDE
        if short_sides:
            short = round(float(np.exp(rng.uniform(np.log(short_sides[0]), np.log(short_sides[1])))))
            side = (round(short * SIDE[0] / SIDE[1]), short)
        crop_w = int(rng.uniform(0.55, 1.0) * width)
        crop_h = min(height, int(crop_w * SIDE[1] / SIDE[0]))
        top, left = rng.integers(0, height - crop_h + 1), rng.integers(0, width - crop_w + 1)
        patch = Image.fromarray(photo[top : top + crop_h, left : left + crop_w]).resize(side, Image.BICUBIC)
        pixels = np.asarray(patch, dtype=np.float32) * rng.uniform(0.8, 1.2, size=3)
        pixels += rng.normal(0, NOISE, size=pixels.shape)
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        if rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        folder = root / "train" / f"n{index % classes:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=QUALITY)
        (folder / f"img_{index:06d}.JPEG").write_bytes(buffer.getvalue())
        sizes.append(len(buffer.getvalue()))
    stamp.write_text(json.dumps({**recipe, "mean_bytes": float(np.mean(sizes))}))
    return root


def mean_jpeg_bytes(root: Path) -> float:
    return json.loads((root / "DONE.json").read_text())["mean_bytes"]


def rate(fn: Callable[[], int], min_seconds: float = 0.0) -> float:
    """Items per second of fn(), which returns how many items it handled."""
    start = time.perf_counter()
    items = fn()
    elapsed = time.perf_counter() - start
    if elapsed < min_seconds:
        raise RuntimeError(f"measurement too short ({elapsed:.2f} s)")
    return items / elapsed


def machine() -> str:
    """CPU model, cores and Python: the machine a figure was measured on."""
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"
