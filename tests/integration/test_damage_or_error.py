"""Damaged data is counted and skipped; an augmentation that fails after the image decoded is a program or settings
error that stops the run in one line naming the sample; and data of which nothing decodes stops it too, instead of
a run (or a resampled stream that never ends) where every sample is skipped as corrupt."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from imagenet_train.compat import ensure_torchvision
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.loading.presets import DecodeThen, ValPreset, decode_rgb
from imagenet_train.loading.stream import EpochLoader, ShardStream

from conftest import SMALL_TRAIN, jpeg_bytes, write_shard

ensure_torchvision()
from torchvision.transforms import v2  # noqa: E402

DRIVER = Path(__file__).with_name("augment_fault_driver.py")


def _shard(path: Path, images: dict[str, bytes]) -> str:
    write_shard(path, {key: {"jpg": data, "cls": b"1"} for key, data in images.items()})
    return str(path)


def _loader(url: str, transform, workers: int = 1, resampled: bool = False, **options) -> EpochLoader:
    stream = ShardStream(urls=[url], transform=transform, batch_size=4, resampled=resampled, **options)
    return EpochLoader(stream, workers, batches=3 if resampled else None)


def test_an_augmentation_error_in_a_worker_stops_naming_the_sample_while_a_bad_jpeg_before_it_is_counted(tmp_path):
    url = _shard(tmp_path / "a.tar", {"s0": b"\xff\xd8\xff not a jpeg", "s1": jpeg_bytes(1), "s2": jpeg_bytes(2)})
    # Both fail with a ValueError: the garbage in its decode (damage), s1 in the crop after it decoded (an error).
    loader = _loader(url, DecodeThen(partial(decode_rgb), v2.RandomCrop(64)), shuffle_buffer=0)
    with pytest.raises(ImagenetTrainError) as raised:
        list(loader)
    message = str(raised.value).splitlines()[-1]
    assert f"sample s1 in {url}: the transform failed after the image decoded (ValueError: Required crop" in message
    assert loader.corrupt_samples == 1
    loader.close()


def test_an_augmentation_that_fails_on_every_image_stops_the_run_with_one_line_and_exit_2(digit_shards, tmp_path):
    args = [*SMALL_TRAIN, "--shards", str(digit_shards), "--mode", "split", "--epochs", "1"]
    args += ["--run-dir", str(tmp_path / "run"), "--no-tensorboard"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, str(DRIVER), "train", *args], capture_output=True, text=True, env=env, timeout=240
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "skipping corrupt sample" not in result.stderr  # not one sample passed off as damaged data
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("imagenet-train: error: sample "), last
    assert f" in file://{digit_shards}" in last or f" in {digit_shards}" in last, last
    assert "the transform failed after the image decoded (ValueError: Required crop size (64, 64)" in last, last


def _not_jpeg(count: int) -> dict[str, bytes]:
    """Images that are PNG, not JPEG: every one a corrupt sample."""
    return {f"p{i}": jpeg_bytes(i, fmt="PNG") for i in range(count)}


def test_a_split_epoch_of_which_no_sample_decodes_stops_instead_of_ending_empty(tmp_path):
    url = _shard(tmp_path / "png.tar", _not_jpeg(10))
    loader = _loader(url, ValPreset(16).build())
    with pytest.raises(ImagenetTrainError, match=r"png\.tar: none of the 10 samples read is usable \(the last: not a"):
        list(loader)
    loader.close()


def test_a_resampled_stream_of_which_no_sample_decodes_stops_instead_of_reading_forever(tmp_path):
    url = _shard(tmp_path / "png.tar", _not_jpeg(10))
    loader = _loader(url, ValPreset(16).build(), resampled=True, max_corrupt_streak=25)
    with pytest.raises(ImagenetTrainError, match=r"png\.tar: 25 samples in a row are corrupt .*--max-corrupt-streak"):
        list(loader)
    loader.close()


def test_scattered_corrupt_samples_never_reach_the_streak_and_zero_turns_the_stop_off(tmp_path):
    images = {f"s{i}": jpeg_bytes(i) if i % 3 == 0 else jpeg_bytes(i, fmt="PNG") for i in range(12)}
    loader = _loader(_shard(tmp_path / "mixed.tar", images), ValPreset(16).build(), workers=0, shuffle_buffer=0)
    assert sum(len(keys) for _, _, keys in loader) == 4 and loader.corrupt_samples == 8  # 2 in a row at most
    loader.close()
    url = _shard(tmp_path / "png.tar", _not_jpeg(6))
    loader = _loader(url, ValPreset(16).build(), workers=0, max_corrupt_streak=0)
    assert list(loader) == [] and loader.corrupt_samples == 6
    loader.close()
