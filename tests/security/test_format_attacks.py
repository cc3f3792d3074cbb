"""Images in formats the project does not use: Pillow never hands them to another plugin.

An EPS file would be opened by Pillow's EPS plugin, which runs Ghostscript on it; a `gs` on PATH that leaves
the marker shows whether that happened. As a shard member it is a corrupt sample (counted); in an ImageFolder
it is a listed skip of `shards`. A TIFF and a BMP, which Pillow would decode, are refused the same way.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
from pathlib import Path

import pytest
from PIL import EpsImagePlugin, Image

from imagenet_train.loading.presets import TrainPreset, ValPreset
from imagenet_train.loading.stages import DamageCounters, decoded, read_shards

from conftest import cli, jpeg_bytes, write_image_folder, write_shard

EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\nnewpath 0 0 moveto 16 16 lineto stroke\nshowpage\n%%EOF\n"


@pytest.fixture
def ghostscript_trap(tmp_path: Path, marker: Path, monkeypatch) -> Path:
    """A `gs` first on PATH that leaves the marker: Ghostscript started means the attack ran."""
    folder = tmp_path / "bin"
    folder.mkdir()
    gs = folder / "gs"
    gs.write_text(f"#!/bin/sh\ntouch {marker}\nexit 0\n")
    gs.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", None)  # found again, from this PATH
    return marker


def hostile_images() -> dict[str, bytes]:
    """Images Pillow would open with plugins other than JPEG's: EPS (Ghostscript), TIFF and BMP."""
    images = {"eps": EPS, "tiff": jpeg_bytes(1, fmt="TIFF"), "bmp": jpeg_bytes(2, fmt="BMP")}
    # Without an allowlist Pillow routes each to its own plugin: the attack is real.
    assert [Image.open(io.BytesIO(data)).format for data in images.values()] == ["EPS", "TIFF", "BMP"]
    return images


@pytest.mark.parametrize("decoder", ["simplejpeg", "pil", "val"])
def test_a_non_jpeg_shard_member_is_a_corrupt_sample_and_ghostscript_never_runs(decoder, tmp_path, ghostscript_trap):
    shard = tmp_path / "x.tar"
    members = {"good0": jpeg_bytes(0), **hostile_images(), "good1": jpeg_bytes(3)}
    write_shard(shard, {key: {"jpg": data, "cls": b"0"} for key, data in members.items()})
    transform = ValPreset(16).build() if decoder == "val" else TrainPreset(16, decoder=decoder).build()
    counters = DamageCounters(multiprocessing.get_context("spawn"))
    kept = [key for _, _, key in decoded(read_shards([str(shard)]), transform, counters)]
    assert not ghostscript_trap.exists()
    assert kept == ["good0", "good1"]
    assert counters.snapshot()[DamageCounters.CORRUPT] == 3


def test_shards_lists_eps_tiff_and_bmp_as_skipped_converts_png_and_never_runs_ghostscript(tmp_path, ghostscript_trap):
    source = tmp_path / "source"
    write_image_folder(source, {"n01": 2, "n02": 2})
    for kind, data in hostile_images().items():
        (source / "train" / "n01" / f"n01_{kind}.JPEG").write_bytes(data)
    (source / "train" / "n02" / "n02_png.JPEG").write_bytes(jpeg_bytes(4, fmt="PNG"))
    result = cli("shards", str(source), str(tmp_path / "out"), "--quiet")
    assert result.returncode == 0, result.stderr
    assert not ghostscript_trap.exists()
    index = json.loads((tmp_path / "out" / "shards.json").read_text())
    skipped = {Path(entry["source"]).name: entry["reason"] for entry in index["skipped"]}
    assert set(skipped) == {"n01_eps.JPEG", "n01_tiff.JPEG", "n01_bmp.JPEG"}
    assert all("not a readable JPEG or PNG image" in reason for reason in skipped.values()), skipped
    assert [Path(entry["source"]).name for entry in index["reencoded"]] == ["n02_png.JPEG"]
    assert index["splits"]["train"]["nsamples"] == 5
