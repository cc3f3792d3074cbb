"""--decoder dali on DALI's CPU backend (how CI checks it): wiring, labels, crop statistics, the demo's accuracy."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from imagenet_train.datasets.source import resolve_source
from imagenet_train.loading.dali import DaliAugment, DaliDecoder, available, jpeg_bytes, pack_jpegs
from imagenet_train.loading.presets import RandomResizedCropFlip, decode_rgb
from imagenet_train.loading.stream import EpochLoader, ShardStream

from conftest import SMALL_TRAIN, read_metrics, torchrun

pytestmark = pytest.mark.skipif(not available(), reason="NVIDIA DALI not installed (pip install '.[dali]')")
CPU = torch.device("cpu")


def gradient_jpeg(width: int = 320, height: int = 240) -> bytes:
    """Red rises left to right, green top to bottom: a crop's colour range tells its box."""
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    pixels = np.stack([x, y, np.full_like(x, 128)], axis=2).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=98)
    return out.getvalue()


def dali_batches(samples: list[tuple[bytes, int, str]], augment: DaliAugment, batch: int = 32):
    packed = [
        pack_jpegs([(jpeg_bytes(d), label, key) for d, label, key in samples[i : i + batch]])
        for i in range(0, len(samples), batch)
    ]
    return list(DaliDecoder(packed, augment, batch, CPU, threads=2, seed=1))


def crop_shape(image: torch.Tensor) -> tuple[float, float, bool]:
    """(width fraction, height fraction, flipped) of a uint8 crop of the gradient image."""
    red, green = image[0].float(), image[1].float()
    side = image.shape[-1]  # the 4-pixel edge bands' centres are side - 4 pixels apart
    width = float(red[:, -4:].mean() - red[:, :4].mean()) / 255 * side / (side - 4)
    height = float(green[-4:, :].mean() - green[:4, :].mean()) / 255 * side / (side - 4)
    return abs(width), height, width < 0


def test_labels_and_keys_stay_with_their_images(digit_shards):
    source = resolve_source(str(digit_shards))
    stream = ShardStream(
        urls=source.val_urls, transform=jpeg_bytes, collate_fn=pack_jpegs, batch_size=16, resampled=False
    )
    loader = EpochLoader(stream, workers=2)
    decoder = DaliDecoder(loader, DaliAugment(32, train=False, resize=32, normalized=False), 16, CPU, threads=2)
    reference = EpochLoader(
        ShardStream(urls=source.val_urls, transform=decode_rgb, batch_size=16, resampled=False), workers=0
    )
    expected = {
        key: (image, int(label))
        for images, labels, keys in reference
        for image, label, key in zip(images, labels, keys, strict=True)
    }
    seen = 0
    for _ in range(2):  # two epochs through the same pipeline and persistent workers
        for images, labels, keys in decoder:
            assert images.shape[1:] == (3, 32, 32) and images.dtype == torch.uint8
            for image, label, key in zip(images, labels.tolist(), keys, strict=True):
                pixels, truth = expected[key]
                assert label == truth
                assert (image.float() - pixels.float()).abs().mean() < 6  # the same picture, decoded by DALI
                seen += 1
    assert seen == 2 * len(expected)
    loader.close()


def test_train_crops_follow_random_resized_crop_statistics():
    data = gradient_jpeg()
    samples = [(data, 0, f"k{i}") for i in range(256)]
    shapes = [
        crop_shape(image)
        for images, _, _ in dali_batches(samples, DaliAugment(64, normalized=False))
        for image in images
    ]
    ours = RandomResizedCropFlip(64, (0.08, 1.0), True)
    torch.manual_seed(0)
    reference = [crop_shape(ours(decode_rgb(data))) for _ in range(256)]
    areas = np.array([w * h for w, h, _ in shapes])
    reference_areas = np.array([w * h for w, h, _ in reference])
    assert areas.min() >= 0.06 and areas.max() <= 1.02
    assert abs(areas.mean() - reference_areas.mean()) < 0.08  # both near 0.5: area uniform in [0.08, 1]
    aspect = np.array([(w * 320) / (h * 240) for w, h, _ in shapes])
    assert aspect.min() >= 0.65 and aspect.max() <= 1.5  # aspect ratio within [3/4, 4/3], measured
    flipped = np.mean([f for _, _, f in shapes])
    assert 0.35 <= flipped <= 0.65


def test_validation_is_a_centre_crop_without_flips():
    data = gradient_jpeg()
    ((images, _, _),) = dali_batches(
        [(data, 0, f"k{i}") for i in range(8)], DaliAugment(56, train=False, normalized=False)
    )
    shapes = {tuple(round(v, 2) for v in crop_shape(image)[:2]) for image in images}
    assert len(shapes) == 1  # deterministic
    width, height, flipped = crop_shape(images[0])
    assert (
        not flipped and width == pytest.approx(0.875 * 240 / 320, abs=0.05) and height == pytest.approx(0.875, abs=0.05)
    )


def test_normalised_output_matches_the_uint8_output_normalised():
    data = gradient_jpeg()
    samples = [(data, 0, "k")]
    ((raw, _, _),) = dali_batches(samples, DaliAugment(32, train=False, normalized=False), batch=1)
    ((normalised, _, _),) = dali_batches(samples, DaliAugment(32, train=False), batch=1)
    from imagenet_train.training.batch_input import normalize

    assert normalised.dtype == torch.float32
    assert torch.allclose(normalize(raw), normalised, atol=1e-4)


def test_decoder_dali_trains_the_digits_demo_on_the_cpu_backend(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    result = torchrun(
        ["--shards", str(digit_shards), "--run-dir", str(run_dir), *SMALL_TRAIN, "--epochs", "3", "--decoder", "dali"],
        nproc=1,
        timeout=290,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = read_metrics(run_dir)
    assert len(metrics) == 3 and metrics[-1]["top1"] >= 0.8, metrics  # simplejpeg's band on this demo


def test_interpolation_reaches_dalis_resize():
    data = _random_blocks_jpeg()
    samples = [(data, 0, "k")]
    ((linear, _, _),) = dali_batches(samples, DaliAugment(96, train=False, resize=96, normalized=False), batch=1)
    again = DaliAugment(96, train=False, resize=96, normalized=False, interpolation="bilinear")
    ((same, _, _),) = dali_batches(samples, again, batch=1)
    cubic = DaliAugment(96, train=False, resize=96, normalized=False, interpolation="bicubic")
    ((bicubic, _, _),) = dali_batches(samples, cubic, batch=1)
    assert torch.equal(linear, same) and not torch.equal(linear, bicubic)


def _random_blocks_jpeg(side: int = 48) -> bytes:
    """Sharp 8-pixel blocks: enlarged, bilinear and bicubic disagree at every edge."""
    pixels = np.random.default_rng(0).integers(0, 256, (side // 8, side // 8, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels.repeat(8, 0).repeat(8, 1)).save(out, "JPEG", quality=95)
    return out.getvalue()
