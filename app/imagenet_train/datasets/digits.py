"""A small real-image dataset in ImageNet's layout: scikit-learn's bundled handwritten digits as JPEGs."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from PIL import Image

from imagenet_train.errors import ImagenetTrainError


def write_digits(root: str | Path, size: int = 64, val_fraction: float = 0.2, seed: int = 0) -> dict[str, int]:
    """Write the 1,797 digits as `train/<class>/*.JPEG` and `val/<class>/*.JPEG`; returns counts per split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImagenetTrainError("demo-data needs scikit-learn (pip install 'imagenet-train[demo]')") from None
    digits = load_digits()
    rng = random.Random(seed)
    counts = {"train": 0, "val": 0}
    for label in range(10):
        indices = [i for i, target in enumerate(digits.target) if target == label]
        rng.shuffle(indices)
        nval = round(len(indices) * val_fraction)
        for position, i in enumerate(indices):
            split = "val" if position < nval else "train"
            # Pixel values are 0..16 on an 8x8 grid: stretch to 0..255 (ink dark on white, like paper).
            pixels = (255 - digits.images[i] * (255 / 16)).astype(np.uint8)
            image = Image.fromarray(pixels, "L").resize((size, size), Image.Resampling.BICUBIC).convert("RGB")
            folder = Path(root) / split / f"digit{label}"
            folder.mkdir(parents=True, exist_ok=True)
            prefix = "val" if split == "val" else f"digit{label}"
            image.save(folder / f"{prefix}_{i:05d}.JPEG", "JPEG", quality=95)
            counts[split] += 1
    return counts
