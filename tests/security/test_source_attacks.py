"""Source images that are mostly not image: `shards` bounds what it reads and writes only the image.

A JPEG followed by junk passed verification whole, and a member over the reader's 64 MiB bound broke its
whole shard in training. Now a source over the cap is listed as skipped before it is read, and the bytes after
a JPEG's end-of-image marker are cut off (listed), so every shard reads back whole.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
from pathlib import Path

import pytest
from PIL import Image

from imagenet_train.io import tarstream
from imagenet_train.loading.stages import DamageCounters, read_shards

from conftest import cli, jpeg_bytes, write_image_folder


@pytest.mark.parametrize("verify", ["full", "header"])
def test_shards_cuts_junk_after_a_jpeg_and_skips_a_source_over_the_cap_unread(verify, tmp_path):
    source = tmp_path / "source"
    write_image_folder(source, {"n01": 2, "n02": 2})
    image = jpeg_bytes(7)
    junk = os.urandom(1 << 20) + b"\xff\xd9"  # ends like a JPEG, which the old header check looked for
    (source / "train" / "n01" / "n01_junk.JPEG").write_bytes(image + junk)
    huge = source / "train" / "n02" / "n02_huge.JPEG"
    huge.write_bytes(image)
    os.truncate(huge, tarstream.MAX_MEMBER_BYTES + 1)  # sparse: 64 MiB of zeros after the image
    result = cli("shards", str(source), str(tmp_path / "out"), "--quiet", "--verify", verify)
    assert result.returncode == 0, result.stderr
    index = json.loads((tmp_path / "out" / "shards.json").read_text())
    skipped = {Path(entry["source"]).name: entry["reason"] for entry in index["skipped"]}
    assert list(skipped) == ["n02_huge.JPEG"] and "cap on a source image" in skipped["n02_huge.JPEG"], skipped
    changed = {Path(entry["source"]).name: entry["reason"] for entry in index["reencoded"]}
    assert "end-of-image" in changed.get("n01_junk.JPEG", ""), changed
    shards = sorted(str(path) for path in (tmp_path / "out").glob("*train*.tar"))
    counters = DamageCounters(multiprocessing.get_context("spawn"))
    samples = {sample["__key__"]: sample for sample in read_shards(shards, counters=counters)}
    assert counters.snapshot() == (0, 0, 0) and len(samples) == 5
    assert samples["n01_junk"]["jpg"] == image


def progressive_with_a_thumbnail_marker(seed: int) -> bytes:
    """A progressive JPEG whose comment segment holds an end-of-image marker, as an EXIF thumbnail's would."""
    buffer = io.BytesIO()
    Image.open(io.BytesIO(jpeg_bytes(seed, (64, 48)))).save(buffer, "JPEG", progressive=True, quality=90)
    data = buffer.getvalue()
    comment = b"thumb \xff\xd8\xff\xd9 end"
    return data[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + data[2:]


def test_the_end_of_image_is_found_past_a_thumbnails_marker_and_every_scan():
    from imagenet_train.datasets.images import jpeg_end, prepare

    data = progressive_with_a_thumbnail_marker(3)
    assert jpeg_end(data) == len(data)
    assert jpeg_end(data + b"\x00" * 100 + b"\xff\xd9") == len(data)
    assert jpeg_end(data[:-2]) is None
    kept, note = prepare(data + b"junk" * 100, verify="header")
    assert kept == data and "400 bytes after" in note
    assert prepare(data + b"\x00\x00", verify="full") == (data, None)  # padding is cut, not listed
