"""Checking and normalising one source image for a shard: JPEG bytes out, or a reason it was skipped."""

from __future__ import annotations

import io
import warnings

import simplejpeg
from PIL import Image

from imagenet_train.datasets.pixels import (
    MAX_IMAGE_PIXELS,
    REENCODE_FORMATS,
    ImageTooLarge,
    UnsupportedFormat,
    check_pixels,
    open_checked,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class UnusableImage(Exception):
    """A source file that cannot become a training sample (the reason is the message)."""


def _reencode(data: bytes, short_side: int | None, quality: int, max_pixels: int) -> bytes:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            image = open_checked(data, max_pixels, REENCODE_FORMATS)
            image.load()
    except ImageTooLarge as error:
        raise UnusableImage(str(error)) from None
    except UnsupportedFormat as error:
        raise UnusableImage(f"{error} (shards converts JPEG and PNG only)") from None
    except Exception as error:
        raise UnusableImage(f"not a decodable image ({type(error).__name__}: {error})") from None
    image = image.convert("RGB")
    if short_side and min(image.size) > short_side:
        scale = short_side / min(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


VERIFY = ("full", "header")


def prepare(
    data: bytes,
    short_side: int | None = None,
    quality: int = 90,
    verify: str = "full",
    max_pixels: int = MAX_IMAGE_PIXELS,
) -> tuple[bytes, str | None]:
    """Return JPEG bytes for a sample and why it was re-encoded (None: original bytes kept).

    An image whose header claims more than `max_pixels` is skipped before anything is decoded: training
    would refuse it anyway, and decoding it here would cost width x height x 3 bytes.

    verify="full" entropy-decodes every block (catches any corrupt data; ~1 ms per ImageNet image);
    "header" checks the header and the end-of-image marker only (catches truncation, the common damage,
    at I/O speed; damage inside the entropy data then surfaces as a logged, counted skip in training).
    """
    if not data:
        raise UnusableImage("empty file")
    if data[:3] != b"\xff\xd8\xff":
        kind = "PNG" if data.startswith(PNG_SIGNATURE) else "non-JPEG"
        return _reencode(data, short_side, quality, max_pixels), f"{kind} data re-encoded as RGB JPEG"
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as error:
        raise UnusableImage(f"unreadable JPEG header ({error})") from None
    try:
        check_pixels(width, height, max_pixels)
    except ImageTooLarge as error:
        raise UnusableImage(str(error)) from None
    if colorspace in ("CMYK", "YCCK"):
        return _reencode(data, short_side, quality, max_pixels), f"{colorspace} JPEG re-encoded as RGB"
    if verify == "header":
        # 0xFFD9 cannot occur inside entropy-coded data (0xFF is stuffed there), so a file cut short has none
        # at its end; a few encoders pad after it.
        if b"\xff\xd9" not in data[-64:]:
            raise UnusableImage("truncated JPEG (no end-of-image marker)")
    else:
        try:
            # A 1/8-scale decode still entropy-decodes every block, so truncation is caught cheaply.
            simplejpeg.decode_jpeg(data, min_height=1, min_width=1, strict=True)
        except ValueError as error:
            raise UnusableImage(f"corrupt JPEG ({error})") from None
    if short_side and min(height, width) > short_side:
        return _reencode(data, short_side, quality, max_pixels), None
    return data, None
