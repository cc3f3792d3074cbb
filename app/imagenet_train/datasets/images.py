"""Checking and normalising one source image for a shard: JPEG bytes out, or a reason it was skipped."""

from __future__ import annotations

import io
import warnings
from enum import Enum

import simplejpeg
from PIL import Image

from imagenet_train.datasets.pixels import (
    REENCODE_FORMATS,
    ImageTooLarge,
    UnsupportedFormat,
    check_pixels,
    open_checked,
)
from imagenet_train.io.tarstream import MAX_MEMBER_BYTES
from imagenet_train.limits import MAX_IMAGE_PIXELS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A source file above this is listed as skipped before it is read: the loader refuses any tar member over the
# same bound (io/tarstream.MAX_MEMBER_BYTES), and ImageNet's largest JPEG is ~15 MB, so nothing usable is lost,
# while a worker never holds more than this of one file.
MAX_SOURCE_BYTES = MAX_MEMBER_BYTES
# Trailing bytes after a JPEG's end-of-image marker are cut off (the decoders stop there; nothing is lost), and
# the cut is listed when more than this many: a few encoders pad after the marker.
TRAILING_LISTED = 64


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


class ImageCheck(str, Enum):
    """How `shards` checks each image (its --verify word)."""

    FULL = "full"  # decode every image: catches any corruption
    HEADER = "header"  # the header and the end marker: I/O speed


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
    height, width, colorspace = _checked_header(data, max_pixels)
    if colorspace in ("CMYK", "YCCK"):
        return _reencode(data, short_side, quality, max_pixels), f"{colorspace} JPEG re-encoded as RGB"
    data, note = _cut_at_end_marker(data)
    if verify != "header":
        _check_entropy_data(data)
    if short_side and min(height, width) > short_side:
        return _reencode(data, short_side, quality, max_pixels), note
    return data, note


def _checked_header(data: bytes, max_pixels: int) -> tuple[int, int, str]:
    """A JPEG's height, width and colorspace from its header, refused over `max_pixels` before any decode."""
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as error:
        raise UnusableImage(f"unreadable JPEG header ({error})") from None
    try:
        check_pixels(width, height, max_pixels)
    except ImageTooLarge as error:
        raise UnusableImage(str(error)) from None
    return height, width, colorspace


def _cut_at_end_marker(data: bytes) -> tuple[bytes, str | None]:
    """The JPEG up to its end-of-image marker, and a note when more than TRAILING_LISTED bytes were cut."""
    end = jpeg_end(data)
    if end is None:
        raise UnusableImage("truncated JPEG (no end-of-image marker)")
    note = None
    if len(data) - end > TRAILING_LISTED:
        note = f"{len(data) - end} bytes after the JPEG's end-of-image marker dropped"
    return data[:end], note


def _check_entropy_data(data: bytes) -> None:
    """Decode every block of the JPEG, so that corrupt or cut entropy data is caught here."""
    try:
        # A 1/8-scale decode still entropy-decodes every block, so truncation is caught cheaply.
        simplejpeg.decode_jpeg(data, min_height=1, min_width=1, strict=True)
    except ValueError as error:
        raise UnusableImage(f"corrupt JPEG ({error})") from None


_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM and RST0-7: markers without a length


def jpeg_end(data: bytes) -> int | None:
    """The offset just past a JPEG's end-of-image marker (None: it has none), found by walking its segments:
    an EXIF thumbnail's own marker lies inside a segment, and 0xFFD9 cannot occur inside entropy-coded data
    (0xFF is stuffed there)."""
    at, size = 2, len(data)
    while at + 1 < size:
        if data[at] != 0xFF:  # stray bytes between segments: libjpeg skips to the next marker, and so do we
            at = data.find(b"\xff", at)
            if at < 0:
                return None
            continue
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte before a marker
            at += 1
        elif marker == 0xD9:
            return at + 2
        elif marker in _STANDALONE:
            at += 2
        elif at + 3 >= size or int.from_bytes(data[at + 2 : at + 4], "big") < 2:
            return None
        else:
            at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
            if marker == 0xDA:  # a scan: entropy-coded data up to the next marker other than RSTn
                at = _scan_end(data, at)
    return None


def _scan_end(data: bytes, at: int) -> int:
    """Where the entropy-coded data starting at `at` ends: the next 0xFF that starts a marker (or the end)."""
    while True:
        at = data.find(b"\xff", at)
        if at < 0 or at + 1 >= len(data):
            return len(data)
        following = data[at + 1]
        if following == 0x00 or 0xD0 <= following <= 0xD7:
            at += 2
        elif following == 0xFF:
            at += 1
        else:
            return at
