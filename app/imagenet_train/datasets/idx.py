"""The idx format of MNIST and Fashion-MNIST (raw or gzip): a magic number, big-endian sizes, then the bytes.

The files are input: every size is bounded before anything is allocated, and a file whose length does not
match its header is refused with one line naming it.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from imagenet_train.errors import ImagenetTrainError

UBYTE = 0x08  # the only element type MNIST-style files use
MAX_ITEMS = 10_000_000  # far above the 60,000 of (Fashion-)MNIST's train set
MAX_SIDE = 4096
MAX_BYTES = 1 << 31  # no idx file this command reads decompresses to more


def read_idx(path: str | Path, dims: int, max_side: int = MAX_SIDE) -> np.ndarray:
    """The uint8 array an idx file holds, `dims` dimensions (1: labels, 3: images), checked against its header."""
    path = Path(path)
    try:
        with _open(path) as stream:
            header = stream.read(4 + 4 * dims)
            if len(header) < 4 or header[:2] != b"\0\0" or header[2] != UBYTE or header[3] != dims:
                raise ImagenetTrainError(
                    f"{path}: not an idx file of {dims}-dimensional unsigned bytes (magic "
                    f"{header[:4].hex() or 'missing'}, expected 0000080{dims})"
                )
            if len(header) < 4 + 4 * dims:
                raise ImagenetTrainError(f"{path}: truncated idx header ({len(header)} bytes)")
            shape = struct.unpack(f">{dims}I", header[4:])
            _check_shape(path, shape, max_side)
            size = int(np.prod(shape))
            data = stream.read(size + 1)  # one more: trailing bytes are refused too
    except (OSError, EOFError, zlib.error) as error:
        raise ImagenetTrainError(f"{path}: cannot read the idx file ({error})") from error
    if len(data) != size:
        state = "truncated" if len(data) < size else "longer than its header says"
        raise ImagenetTrainError(f"{path}: {state}: header {shape} needs {size} bytes of data")
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def _open(path: Path):
    """The file, decompressed when it is gzip (by its magic, not its name)."""
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def _check_shape(path: Path, shape: tuple[int, ...], max_side: int) -> None:
    """Refuse sizes no MNIST-style file has, before they are allocated."""
    if not 1 <= shape[0] <= MAX_ITEMS:
        raise ImagenetTrainError(f"{path}: {shape[0]} items; expected 1 to {MAX_ITEMS}")
    if any(not 1 <= side <= max_side for side in shape[1:]):
        raise ImagenetTrainError(f"{path}: image size {'x'.join(map(str, shape[1:]))}; expected sides 1 to {max_side}")
    if int(np.prod(shape)) > MAX_BYTES:
        raise ImagenetTrainError(f"{path}: {int(np.prod(shape))} bytes of data; expected at most {MAX_BYTES}")


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write a uint8 array as an idx file (gzip when the name ends in .gz): for tests and small fixtures."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, UBYTE, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as stream:
        stream.write(header + array.tobytes())
