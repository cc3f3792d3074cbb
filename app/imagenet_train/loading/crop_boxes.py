"""RandomResizedCrop's box, drawn exactly as torchvision draws it, for decoders that crop before decoding."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from imagenet_train.limits import MIN_CROP_SCALE


@dataclass(frozen=True)
class Box:
    """A crop box in source pixels: top, left, height, width (torchvision's order)."""

    top: int
    left: int
    height: int
    width: int


def random_resized_crop_box(
    height: int,
    width: int,
    scale: tuple[float, float] = (MIN_CROP_SCALE, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Box:
    """torchvision's RandomResizedCrop.get_params, on the same torch RNG: same distribution by construction."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0].item(), log_ratio[1].item())).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,)).item())
            left = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return Box(top, left, h, w)
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return Box((height - h) // 2, (width - w) // 2, h, w)
