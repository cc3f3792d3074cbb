"""The pixel cap: an image's size read from its header and refused before any decoder allocates for it.

A JPEG's header may claim 65535 x 65535 px in a file of a few MB (a flat image compresses to ~2 bits per
8x8 block), and a decoder allocates width x height x 3 bytes before it reads a single block. Every decoder
path (simplejpeg, PIL, fused PyTurboJPEG, the DALI hand-over, and `shards`) checks the header's size here
first, so a worker's memory per image is bounded by the cap, whatever the shard says. Here too: what a decode
failure is (CorruptImage, data damage), told apart from a failure of the augmentation after it (a program error).
"""

from __future__ import annotations

import contextlib
import functools
import io
import struct
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from PIL import Image


# Pillow hands bytes to whichever of its ~40 plugins claims them: EPS and PDF start Ghostscript, others are
# rarely exercised parsers. Training decodes JPEG only; `shards` also re-encodes PNG. Anything else is a
# corrupt sample in training and a listed skip in `shards`.
DECODE_FORMATS = ("JPEG",)
REENCODE_FORMATS = ("JPEG", "PNG")


class CorruptImage(ValueError):
    """Image bytes that do not decode: damaged or hostile data, a corrupt sample in training (counted, skipped).

    Only the decode raises it; an error of the augmentation after it is a program or settings error instead."""


class ImageTooLarge(CorruptImage):
    """An image whose header claims more pixels than the cap allows."""


class UnsupportedFormat(CorruptImage):
    """Bytes that are not an image of an allowed format (or not readable as one)."""


# What the decoders raise on damaged bytes: PIL OSError (UnidentifiedImageError, "image file is truncated", a
# decoder error), SyntaxError from a plugin's header parser, EOFError and struct.error from a cut header,
# ValueError; simplejpeg ValueError; PyTurboJPEG OSError. PIL's DecompressionBombError is added where it is
# imported (decoding), so that config.py, which imports this module for the cap, does not load PIL.
DECODE_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, SyntaxError, EOFError, struct.error)


@contextlib.contextmanager
def decoding() -> Iterator[None]:
    """Around a decoder's calls: a decoder error (data damage) comes out as CorruptImage, anything else as it is."""
    from PIL import Image

    damage: tuple[type[BaseException], ...] = (*DECODE_ERRORS, Image.DecompressionBombError)
    try:
        yield
    except CorruptImage:
        raise
    except damage as error:
        raise CorruptImage(f"{type(error).__name__}: {error}") from error


Arguments = ParamSpec("Arguments")
Decoded = TypeVar("Decoded")


def decoder(function: Callable[Arguments, Decoded]) -> Callable[Arguments, Decoded]:
    """A decode function whose decoder errors (data damage) come out as CorruptImage."""

    @functools.wraps(function)
    def decode(*args: Arguments.args, **kwargs: Arguments.kwargs) -> Decoded:
        with decoding():
            return function(*args, **kwargs)

    return decode


def check_pixels(width: int, height: int, limit: int) -> None:
    """Refuse an image of width x height px above `limit` pixels (0: no cap), before it is decoded."""
    if limit and width * height > limit:
        raise ImageTooLarge(
            f"image of {width}x{height} px ({width * height / 1e6:.0f} MP) is over the cap of "
            f"{limit} px (--max-image-pixels)"
        )


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the header alone: libjpeg-turbo's header parse (~1 us), PIL's lazy open otherwise."""
    import simplejpeg  # here, not at the top: config.py imports this module for the cap's default

    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        with open_checked(data, 0) as image:
            return image.size
    return width, height


def check_image(data: bytes, limit: int) -> None:
    """Refuse encoded image bytes whose header claims more than `limit` pixels."""
    check_pixels(*image_size(data), limit)


def open_checked(data: bytes, limit: int, formats: tuple[str, ...] = DECODE_FORMATS) -> Image.Image:
    """PIL's lazy open (header only) by the plugins of `formats` alone, refused above `limit` pixels before
    anything is decoded."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data), formats=list(formats))
    except UnidentifiedImageError:
        raise UnsupportedFormat(f"not a readable {' or '.join(formats)} image") from None
    try:
        check_pixels(*image.size, limit)
    except ImageTooLarge:
        image.close()
        raise
    return image
