"""The shard tar reader against archives written by Python's tarfile in every format, and damaged ones."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from imagenet_train.io import tarstream

pytestmark = pytest.mark.unit


def archive(members: dict[str, bytes], fmt: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        directory = tarfile.TarInfo("a-directory")
        directory.type = tarfile.DIRTYPE
        tar.addfile(directory)  # not a regular file: skipped
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


MEMBERS = {
    "n01440764_10026.jpg": os.urandom(1000),
    "n01440764_10026.cls": b"0",
    "nested/dir/k2.jpg": os.urandom(512),  # exactly one block: no padding
    "x" * 120 + "/long-key.jpg": b"",  # needs a long-name extension (GNU, pax) or the ustar prefix
    "ünïcode.json": b"{}",
}


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_members_match_tarfile_in_every_format(fmt):
    data = archive(MEMBERS, fmt)
    with tarfile.open(fileobj=io.BytesIO(data)) as reference:
        expected = [(m.name, reference.extractfile(m).read()) for m in reference if m.isreg()]
    assert list(tarstream.members(io.BytesIO(data))) == expected == list(MEMBERS.items())


def test_a_cut_or_garbage_stream_is_an_error_not_silence():
    data = archive(MEMBERS, tarfile.GNU_FORMAT)
    with pytest.raises(tarstream.TarFormatError, match="truncated member"):
        list(tarstream.members(io.BytesIO(data[:1200])))
    with pytest.raises(tarstream.TarFormatError, match="checksum"):
        list(tarstream.members(io.BytesIO(b"this is not a tar file" * 40)))
    first_member_end = 512 + 512 + 1024  # directory header, then a header + 1000 bytes padded: between members
    with pytest.raises(tarstream.TarFormatError, match="end-of-archive"):
        list(tarstream.members(io.BytesIO(data[:first_member_end])))
    damaged = bytearray(data)
    damaged[10] ^= 0xFF  # a flipped bit in the first header
    with pytest.raises(tarstream.TarFormatError, match="checksum"):
        list(tarstream.members(io.BytesIO(bytes(damaged))))
