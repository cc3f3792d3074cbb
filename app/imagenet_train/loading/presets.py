"""Decoding and augmentation: what a sample's JPEG becomes before batching (uint8), and normalisation after."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import simplejpeg
import torch

from imagenet_train.choices import AutoAugment, Decoder, Interpolation
from imagenet_train.compat import ensure_torchvision
from imagenet_train.datasets.pixels import check_pixels, decoder, open_checked
from imagenet_train.limits import CROP_SIZE, MAX_IMAGE_PIXELS, MIN_CROP_SCALE
from imagenet_train.loading.augment import after_crop, interpolation_mode
from imagenet_train.loading.crop_boxes import random_resized_crop_box
from imagenet_train.loading.sized import Then, at_size

ensure_torchvision()
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.v2 import functional  # noqa: E402


@decoder
def decode_pil(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> torch.Tensor:
    """JPEG bytes to a uint8 CHW RGB tensor by PIL (other formats and images above `max_pixels` refused); damaged
    bytes raise CorruptImage."""
    with open_checked(data, max_pixels) as image:
        array = np.asarray(image.convert("RGB"))
    return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)


@decoder
def decode_rgb(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> torch.Tensor:
    """JPEG bytes to a uint8 CHW RGB tensor; libjpeg-turbo first, PIL (JPEG plugin only) as fallback.
    An image over `max_pixels` is refused from its header (ImageTooLarge) before anything is decoded; damaged bytes
    raise CorruptImage."""
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return decode_pil(data, max_pixels)
    check_pixels(width, height, max_pixels)
    try:
        array = simplejpeg.decode_jpeg(data, colorspace="RGB")
    except ValueError:
        return decode_pil(data, max_pixels)
    return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)


@dataclass(frozen=True)
class DecodeThen:
    """bytes → uint8 CHW tensor: decode, then a transform on the decoded image (picklable for workers)."""

    decode: Callable[[bytes], torch.Tensor]
    transform: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, data: bytes) -> torch.Tensor:
        return self.transform(self.decode(data))

    def at_size(self, size: int) -> DecodeThen:
        """The same decode, its transform cropping to `size` (the epoch's, under progressive resizing)."""
        return dataclasses.replace(self, transform=at_size(self.transform, size))


@dataclass(frozen=True)
class RandomResizedCropFlip:
    """v2.RandomResizedCrop + RandomHorizontalFlip on a uint8 CHW tensor: the same random draws, called
    directly (the v2 container's dispatch costs as much as the resize itself)."""

    size: int
    scale: tuple[float, float]
    hflip: bool
    interpolation: Interpolation | str = Interpolation.BILINEAR

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        box = random_resized_crop_box(image.shape[-2], image.shape[-1], self.scale)
        mode = interpolation_mode(self.interpolation)
        out = functional.resized_crop(
            image, box.top, box.left, box.height, box.width, [self.size] * 2, interpolation=mode, antialias=True
        )
        if self.hflip and torch.rand(1).item() < 0.5:
            out = out.flip(-1)
        return out

    def at_size(self, size: int) -> RandomResizedCropFlip:
        """The same crop to `size`."""
        return dataclasses.replace(self, size=size)


@dataclass(frozen=True)
class TrainPreset:
    """RandomResizedCrop to `size` (area fraction from `min_scale` to 1) and an optional horizontal flip.

    `decoder` picks how: simplejpeg or pil decode the whole image and crop the uint8 tensor; fused crops and
    scales inside libjpeg-turbo (imagenet_train.loading.fused_decoder). All three draw the same crop distribution.
    """

    size: int = CROP_SIZE
    min_scale: float = MIN_CROP_SCALE
    hflip: bool = True
    decoder: Decoder | str = Decoder.SIMPLEJPEG
    max_pixels: int = MAX_IMAGE_PIXELS  # images above it are refused from their header (a corrupt sample)
    auto_augment: AutoAugment | str = AutoAugment.NONE  # a policy on the uint8 crop (loading.augment)
    random_erase: float = 0.0  # RandomErasing's probability, after the policy
    interpolation: Interpolation | str = Interpolation.BILINEAR  # the crop's resize and the policy's

    def build(self) -> Callable[[bytes], torch.Tensor]:
        """The per-sample transform; it takes another crop size through `at_size` (loading.augment)."""
        crop: Callable[[bytes], torch.Tensor]
        if self.decoder == Decoder.FUSED:
            from imagenet_train.loading.fused_decoder import FusedCropDecoder

            crop = FusedCropDecoder(self.size, (self.min_scale, 1.0), self.hflip, self.max_pixels, self.interpolation)
        else:
            decode = decode_pil if self.decoder == Decoder.PIL else decode_rgb
            crop = DecodeThen(
                partial(decode, max_pixels=self.max_pixels),
                RandomResizedCropFlip(self.size, (self.min_scale, 1.0), self.hflip, self.interpolation),
            )
        after = after_crop(self.auto_augment, self.random_erase, self.interpolation)
        return Then(crop, after) if after else crop


@dataclass(frozen=True)
class ValPreset:
    """Resize the short side to `resize` (default size / 0.875), then centre-crop `size`."""

    size: int = CROP_SIZE
    resize: int | None = None
    max_pixels: int = MAX_IMAGE_PIXELS
    interpolation: Interpolation | str = Interpolation.BILINEAR

    def build(self) -> Callable[[bytes], torch.Tensor]:
        """The per-sample transform: decode, resize the short side, centre-crop."""
        resize = self.resize or round(self.size / 0.875)
        decode = partial(decode_rgb, max_pixels=self.max_pixels)
        mode = interpolation_mode(self.interpolation)
        return DecodeThen(
            decode, v2.Compose([v2.Resize(resize, interpolation=mode, antialias=True), v2.CenterCrop(self.size)])
        )
