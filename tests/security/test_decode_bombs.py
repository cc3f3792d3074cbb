"""A 2.2 MB JPEG whose header says 24000 x 24000 px (1.7 GB decoded): `shards` skips and lists it, training
counts it as a corrupt sample on every decoder path, and no decoder allocates for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .bombs import flat_jpeg
from conftest import REPO, cli, write_image_folder

BOMB_SIDE = 24000


@pytest.mark.timeout(120)
def test_shards_skips_and_lists_an_image_whose_header_claims_576_megapixels(tmp_path, marker):
    source = tmp_path / "source"
    write_image_folder(source, {"n01": 3, "n02": 3})
    bomb = source / "train" / "n01" / "n01_bomb.JPEG"
    bomb.write_bytes(flat_jpeg(BOMB_SIDE, BOMB_SIDE))
    result = cli("shards", str(source), str(tmp_path / "out"), "--quiet")
    assert result.returncode == 0, result.stderr
    assert "skipped (not usable): 1" in result.stdout
    listed = [line for line in result.stdout.splitlines() if "n01_bomb.JPEG" in line]
    assert listed and "24000x24000" in listed[0] and "--max-image-pixels" in listed[0]
    index = json.loads((tmp_path / "out" / "shards.json").read_text())
    assert index["splits"]["train"]["nsamples"] == 6
    assert not marker.exists()


# Runs in a fresh process, so its peak RSS (ru_maxrss) measures the decode of the bomb alone.
PROBE = """
import io, json, resource, sys, tarfile
sys.path.insert(0, sys.argv[1])
from bombs import flat_jpeg
from imagenet_train.loading.stages import DamageCounters, decoded, read_shards
from imagenet_train.loading.presets import TrainPreset, ValPreset
from imagenet_train.loading.dali import jpeg_bytes
from imagenet_train.loading import fused_decoder
import multiprocessing

def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

good, bomb = flat_jpeg(64, 48), flat_jpeg(%(side)d, %(side)d)
shard = sys.argv[2]
with tarfile.open(shard, "w") as tar:
    for key, data in (("a", good), ("bomb", bomb), ("b", good)):
        for ext, payload in (("jpg", data), ("cls", b"1")):
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
decoders = {
    "simplejpeg": TrainPreset(32).build(),
    "pil": TrainPreset(32, decoder="pil").build(),
    "val": ValPreset(32).build(),
    "dali-hand-over": jpeg_bytes,
}
if fused_decoder.available():
    decoders["fused"] = TrainPreset(32, decoder="fused").build()
for transform in decoders.values():
    transform(good)  # warm up every library before the baseline
before = rss_mb()
report = {}
for name, transform in decoders.items():
    counters = DamageCounters(multiprocessing.get_context("spawn"))
    keys = [key for _, _, key in decoded(read_shards([shard]), transform, counters)]
    report[name] = {"keys": keys, "corrupt": counters.snapshot()[0]}
report["rss_growth_mb"] = rss_mb() - before
print(json.dumps(report))
"""


@pytest.mark.timeout(180)
def test_training_counts_the_bomb_as_corrupt_on_every_decoder_without_allocating_for_it(tmp_path, marker):
    script = PROBE % {"side": BOMB_SIDE}
    result = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).parent), str(tmp_path / "bomb.tar")],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    growth = report.pop("rss_growth_mb")
    for name, outcome in report.items():
        assert outcome == {"keys": ["a", "b"], "corrupt": 1}, name
    # Decoding it would cost 24000^2 x 3 bytes = 1.7 GB; refused from the header, it costs nothing.
    assert growth < 64, f"peak RSS grew by {growth:.0f} MB while refusing the bomb"
    assert not marker.exists()


def test_an_image_at_the_cap_still_decodes_and_the_cap_can_be_raised():
    from imagenet_train.datasets.pixels import ImageTooLarge
    from imagenet_train.loading.presets import decode_rgb

    image = flat_jpeg(300, 200)
    assert tuple(decode_rgb(image, max_pixels=60_000).shape) == (3, 200, 300)
    with pytest.raises(ImageTooLarge, match="300x200 px"):
        decode_rgb(image, max_pixels=59_999)
    assert tuple(decode_rgb(image, max_pixels=0).shape) == (3, 200, 300)  # 0: no cap
