"""The fused train decoder: RandomResizedCrop done inside the JPEG decoder, as DALI and FFCV do.

RandomResizedCrop keeps 8-100% of an image's area and scales it to 224 px, so most decoded pixels are
thrown away. Here the crop box is drawn from the header's size alone (torchvision's exact sampling, on
torch's RNG), the JPEG is cropped losslessly at MCU boundaries (libjpeg-turbo's tjTransform), decoded
with the smallest DCT scale that keeps the box at least `size` px on both sides, and only that small
image is resized. Progressive, CMYK and anything libjpeg-turbo cannot read take the plain path
(full decode, same box), so every image gets the same crop distribution.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import torch

from imagenet_train.choices import Interpolation
from imagenet_train.compat import ensure_torchvision
from imagenet_train.datasets.pixels import check_pixels, decoding, open_checked
from imagenet_train.limits import CROP_SIZE, MAX_IMAGE_PIXELS, MIN_CROP_SCALE
from imagenet_train.loading.crop_boxes import Box, random_resized_crop_box

ensure_torchvision()
from torchvision.transforms.v2 import functional  # noqa: E402

if TYPE_CHECKING:
    from turbojpeg import TurboJPEG

TJCS_CMYK, TJCS_YCCK = 3, 4
TJPF_RGB = 0
MCU = {0: (8, 8), 1: (16, 8), 2: (16, 16), 3: (8, 8), 4: (8, 16), 5: (32, 8)}  # by TJSAMP_*
SOF2 = b"\xff\xc2"  # progressive frame header


def dct_scale(box: Box, size: int, factors: list[Fraction]) -> Fraction:
    """The smallest libjpeg DCT scale (n/8) that keeps the box at least `size` px on both sides."""
    for factor in factors:
        if box.width * factor >= size and box.height * factor >= size:
            return factor
    return Fraction(1)


def resize_box(
    image: np.ndarray,
    box: tuple[float, float, float, float],
    size: int,
    interpolation: Interpolation | str = Interpolation.BILINEAR,
) -> torch.Tensor:
    """The (left, top, right, bottom) box of an HWC uint8 image, resized (antialiased, bilinear or bicubic) to a
    CHW size x size tensor. The HWC memory is kept (a channels-last view): torch's uint8 SIMD resize needs it."""
    left, top, right, bottom = (int(round(v)) for v in box)
    view = torch.from_numpy(image).permute(2, 0, 1)[:, top : max(bottom, top + 1), left : max(right, left + 1)]
    mode = functional.InterpolationMode(str(interpolation))
    return functional.resize(view, [size, size], interpolation=mode, antialias=True)


class FusedCropDecoder:
    """bytes → uint8 CHW tensor of a random resized crop (and flip), decoding only what the crop needs."""

    def __init__(
        self,
        size: int = CROP_SIZE,
        scale: tuple[float, float] = (MIN_CROP_SCALE, 1.0),
        hflip: bool = True,
        max_pixels: int = MAX_IMAGE_PIXELS,
        interpolation: Interpolation | str = Interpolation.BILINEAR,  # the final resize's; the DCT scales first
    ):
        self.size, self.scale, self.hflip, self.max_pixels = size, scale, hflip, max_pixels
        self.interpolation = interpolation
        self._jpeg: TurboJPEG | None = None
        self.fused = self.fallbacks = 0  # how often each path ran, for benchmarks and tests

    @property
    def jpeg(self):
        """The libturbojpeg binding, made in the process that uses it (it holds a ctypes library)."""
        if self._jpeg is None:
            from turbojpeg import TurboJPEG

            self._jpeg = TurboJPEG()
            self.factors = sorted(Fraction(n, d) for n, d in self._jpeg.scaling_factors if Fraction(n, d) <= 1)
        return self._jpeg

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_jpeg": None}

    def at_size(self, size: int) -> FusedCropDecoder:
        """The same decoder cropping to `size`."""
        return FusedCropDecoder(size, self.scale, self.hflip, self.max_pixels, self.interpolation)

    def __call__(self, data: bytes) -> torch.Tensor:
        jpeg = self.jpeg  # loaded outside `decoding`: a library that fails to load is no damage of the data
        with decoding():  # the decode's errors are a corrupt sample; the resize's after it are not
            try:
                width, height, subsample, colorspace = jpeg.decode_header(data)
            except OSError:
                width = 0
            else:
                check_pixels(width, height, self.max_pixels)  # before either path allocates for the image
            if not width or colorspace in (TJCS_CMYK, TJCS_YCCK) or subsample not in MCU or SOF2 in data[:65536]:
                decoded, region = self._plain(data)
            else:
                decoded, region = self._fused(data, (width, height), MCU[subsample])
        out = resize_box(decoded, region, self.size, self.interpolation)
        if self.hflip and torch.rand(1).item() < 0.5:
            out = out.flip(-1)
        return out

    def crop(self, data: bytes, box: Box, image_size: tuple[int, int], mcu: tuple[int, int]) -> torch.Tensor:
        """The box of this JPEG resized to size x size, via lossless crop + DCT-scaled decode."""
        with decoding():
            decoded, region = self._decode_box(data, box, image_size, mcu)
        return resize_box(decoded, region, self.size, self.interpolation)

    def _fused(self, data: bytes, image_size: tuple[int, int], mcu: tuple[int, int]) -> tuple[np.ndarray, tuple]:
        """A random box drawn from the header's size, and only that box decoded."""
        box = random_resized_crop_box(image_size[1], image_size[0], self.scale)
        return self._decode_box(data, box, image_size, mcu)

    def _decode_box(
        self, data: bytes, box: Box, image_size: tuple[int, int], mcu: tuple[int, int]
    ) -> tuple[np.ndarray, tuple[float, float, float, float]]:
        """The box's MCU-aligned crop of this JPEG decoded at the DCT scale, and where the box lies in it."""
        width, height = image_size
        self.jpeg  # noqa: B018 - loads the library and its scaling factors
        left, top = box.left - box.left % mcu[0], box.top - box.top % mcu[1]
        right, bottom = box.left + box.width, box.top + box.height
        # tjTransform (as PyTurboJPEG drives it) drops a partial last MCU column/row: a box that reaches
        # into it is decoded from the whole image instead, so the crop stays exact.
        inside = right <= width - width % mcu[0] and bottom <= height - height % mcu[1]
        factor = dct_scale(box, self.size, self.factors)
        if inside and (left, top, right, bottom) != (0, 0, width, height):
            data = self.jpeg.crop(data, left, top, right - left, bottom - top, copynone=True)
        else:
            left, top = 0, 0
        self.fused += 1
        decoded = self.jpeg.decode(data, pixel_format=TJPF_RGB, scaling_factor=(factor.numerator, factor.denominator))
        f = float(factor)
        region = ((box.left - left) * f, (box.top - top) * f, (right - left) * f, (bottom - top) * f)
        return decoded, (region[0], region[1], min(region[2], decoded.shape[1]), min(region[3], decoded.shape[0]))

    def _plain(self, data: bytes) -> tuple[np.ndarray, tuple[float, float, float, float]]:
        """Full decode (PIL handles CMYK and progressive JPEGs), and the same crop's box in it."""
        self.fallbacks += 1
        with open_checked(data, self.max_pixels) as image:
            array = np.asarray(image.convert("RGB"))
        box = random_resized_crop_box(array.shape[0], array.shape[1], self.scale)
        return array, (box.left, box.top, box.left + box.width, box.top + box.height)


def available() -> bool:
    """Whether PyTurboJPEG and a libturbojpeg it can load are present."""
    try:
        from turbojpeg import TurboJPEG

        TurboJPEG()
    except (ImportError, RuntimeError, OSError):
        return False
    return True
