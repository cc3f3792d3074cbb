"""A CLI target for tests: `imagenet-train ARGS...` with a train augmentation that cannot work on the data: each
image decodes, then a RandomCrop twice the crop size (larger than any digit image) raises torchvision's ValueError,
on every sample alike, as a bug or a bad setting in augmentation would."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial

import torch

from imagenet_train import cli
from imagenet_train.compat import ensure_torchvision
from imagenet_train.loading import presets

ensure_torchvision()
from torchvision.transforms import v2  # noqa: E402


def crop_too_large(preset: presets.TrainPreset) -> Callable[[bytes], torch.Tensor]:
    """The preset's decode, then a crop the images are too small for (picklable: the workers rebuild it)."""
    return presets.DecodeThen(partial(presets.decode_rgb, max_pixels=preset.max_pixels), v2.RandomCrop(preset.size * 2))


if __name__ == "__main__":
    presets.TrainPreset.build = crop_too_large  # type: ignore[method-assign]
    sys.exit(cli.main(sys.argv[1:]))
