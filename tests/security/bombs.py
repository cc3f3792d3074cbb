"""Hostile inputs built cheaply in memory: a JPEG whose pixels cost far more than its bytes, and tar headers
with chosen (malformed) fields and valid checksums."""

from __future__ import annotations

import struct


def _segment(marker: int, payload: bytes) -> bytes:
    return struct.pack(">HH", marker, len(payload) + 2) + payload


def flat_jpeg(width: int, height: int) -> bytes:
    """A valid baseline grey JPEG of width x height px of one flat colour in ~2 bits per 8x8 block.

    Both Huffman tables hold a single 1-bit code (DC difference 0, AC end-of-block), so every block is the
    bits `00`: 24000 x 24000 px is 2.2 MB of file and 1.7 GB as decoded RGB. Built in microseconds.
    """
    blocks = -(-width // 8) * -(-height // 8)
    bits = 2 * blocks
    data = bytearray(-(-bits // 8))
    if bits % 8:
        data[-1] = (1 << (8 - bits % 8)) - 1  # JPEG pads the last byte with 1 bits
    one_code = bytes([1] + [0] * 15)
    return b"".join(
        [
            b"\xff\xd8",
            _segment(0xFFDB, b"\x00" + bytes([1] * 64)),
            _segment(0xFFC0, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00"),
            _segment(0xFFC4, b"\x00" + one_code + b"\x00"),  # DC table 0: category 0
            _segment(0xFFC4, b"\x10" + one_code + b"\x00"),  # AC table 0: end of block
            _segment(0xFFDA, b"\x01\x01\x00\x00\x3f\x00"),
            bytes(data),
            b"\xff\xd9",
        ]
    )


def tar_header(name: bytes, size_field: bytes | None = None, kind: bytes = b"0", size: int = 0) -> bytes:
    """A ustar header block with a correct checksum; `size_field` (12 bytes) replaces the octal size."""
    header = bytearray(512)
    header[: len(name[:100])] = name[:100]
    header[100:108] = b"0000444\x00"
    header[108:116] = header[116:124] = b"0000000\x00"
    header[124:136] = size_field if size_field is not None else b"%011o\x00" % size
    header[136:148] = b"00000000000\x00"
    header[156:157] = kind
    header[257:265] = b"ustar\x0000"
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\x00 " % sum(header)
    return bytes(header)


def tar_member(name: bytes, data: bytes, kind: bytes = b"0") -> bytes:
    """A whole member: header, data, padding to the block."""
    return tar_header(name, kind=kind, size=len(data)) + data + bytes(-len(data) % 512)


def fix_checksums(data: bytearray) -> None:
    """Recompute the checksum of every block that carries the ustar magic, so mutations reach the parser."""
    for start in range(0, len(data) - 511, 512):
        if data[start + 257 : start + 262] == b"ustar":
            data[start + 148 : start + 156] = b" " * 8
            data[start + 148 : start + 156] = b"%06o\x00 " % (sum(data[start : start + 512]) & 0o777777)
