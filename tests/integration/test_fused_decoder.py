"""The fused crop-and-scale decoder: torchvision's crop distribution, decode-then-crop pixels, fallbacks."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import stats

from imagenet_train.compat import ensure_torchvision
from imagenet_train.config import Config
from imagenet_train.config_checks import checked
from imagenet_train.datasets.pixels import UnsupportedFormat
from imagenet_train.datasets.source import resolve_source
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.loading import crop_boxes, fused_decoder
from imagenet_train.loading.presets import TrainPreset, decode_rgb
from imagenet_train.loading.stream import EpochLoader, ShardStream

ensure_torchvision()
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.v2 import functional  # noqa: E402


def photo_jpeg(width: int = 500, height: int = 375, quality: int = 90, **save) -> bytes:
    """A real photo (scikit-learn's sample) at ImageNet's size."""
    from sklearn.datasets import load_sample_images

    image = Image.fromarray(load_sample_images().images[0]).resize((width, height), Image.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality, **save)
    return buffer.getvalue()


def box_features(boxes: list[tuple[int, int, int, int]], height: int, width: int) -> dict[str, np.ndarray]:
    array = np.array(boxes, dtype=float)  # top, left, h, w
    return {
        "area": array[:, 2] * array[:, 3] / (height * width),
        "aspect": array[:, 3] / array[:, 2],
        "centre_x": (array[:, 1] + array[:, 3] / 2) / width,
        "centre_y": (array[:, 0] + array[:, 2] / 2) / height,
    }


@pytest.mark.parametrize(("height", "width"), [(375, 500), (500, 333), (64, 900)])
def test_crop_boxes_follow_torchvisions_random_resized_crop_distribution(height, width):
    torch.manual_seed(0)
    ours = [tuple(vars(crop_boxes.random_resized_crop_box(height, width)).values()) for _ in range(20000)]
    torch.manual_seed(1)
    reference = v2.RandomResizedCrop(224)
    image = torch.zeros(3, height, width, dtype=torch.uint8)
    theirs = []
    for _ in range(20000):
        params = reference.make_params([image])
        theirs.append((params["top"], params["left"], params["height"], params["width"]))
    a, b = box_features(ours, height, width), box_features(theirs, height, width)
    for name in a:
        result = stats.ks_2samp(a[name], b[name])
        assert result.pvalue > 1e-3, f"{name}: KS statistic {result.statistic:.4f}, p={result.pvalue:.2g}"


def test_the_distribution_test_tells_a_different_scale_range_apart():
    torch.manual_seed(0)
    wide = [tuple(vars(crop_boxes.random_resized_crop_box(375, 500)).values()) for _ in range(5000)]
    narrow = [tuple(vars(crop_boxes.random_resized_crop_box(375, 500, (0.3, 1.0))).values()) for _ in range(5000)]
    result = stats.ks_2samp(box_features(narrow, 375, 500)["area"], box_features(wide, 375, 500)["area"])
    assert result.pvalue < 1e-6


@pytest.mark.parametrize(
    "box",
    [
        crop_boxes.Box(0, 0, 375, 500),  # everything: DCT scale 5/8 (375 -> 234)
        crop_boxes.Box(37, 60, 300, 280),  # inside: lossless crop, scale 7/8 or 3/4
        crop_boxes.Box(100, 200, 120, 130),  # small: lossless crop, full-size decode, upscaled
        crop_boxes.Box(200, 300, 175, 200),  # touches the right/bottom partial MCUs: whole-image path
        crop_boxes.Box(5, 3, 240, 230),  # unaligned origin
    ],
)
def test_fused_crop_matches_decode_then_crop_within_a_small_pixel_error(box):
    data = photo_jpeg()
    decoder = fused_decoder.FusedCropDecoder(224, hflip=False)
    fused = decoder.crop(data, box, (500, 375), fused_decoder.MCU[decoder.jpeg.decode_header(data)[2]])
    reference = functional.resized_crop(
        decode_rgb(data), box.top, box.left, box.height, box.width, [224, 224], antialias=True
    )
    assert fused.shape == (3, 224, 224) and fused.dtype == torch.uint8
    error = (fused.int() - reference.int()).abs().float()
    assert error.mean() < 4.0, f"mean abs error {error.mean():.2f}"
    # DCT scaling is a different (box-like) downsampling filter than an antialiased bilinear resize: a few
    # levels on average, larger only on sharp edges. At scale 1 the two agree exactly (error 0.0-0.02).
    assert torch.quantile(error.flatten(), 0.99) < 32


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (photo_jpeg(progressive=True), "progressive"),
        (None, "cmyk"),
    ],
)
def test_progressive_and_cmyk_jpegs_fall_back_to_a_full_decode(data, kind):
    image = Image.fromarray(np.asarray(Image.open(io.BytesIO(photo_jpeg()))))
    buffer = io.BytesIO()
    if kind == "cmyk":
        image.convert("CMYK").save(buffer, "JPEG", quality=90)
        data = buffer.getvalue()
    decoder = fused_decoder.FusedCropDecoder(224)
    out = decoder(data)
    assert out.shape == (3, 224, 224) and out.dtype == torch.uint8
    assert decoder.fallbacks == 1 and decoder.fused == 0
    assert out.float().mean() > 20  # a real picture, not zeros


def test_a_png_is_refused_by_the_fallback_as_not_a_jpeg():
    buffer = io.BytesIO()
    Image.open(io.BytesIO(photo_jpeg())).save(buffer, "PNG")
    with pytest.raises(UnsupportedFormat, match="not a readable JPEG image"):
        fused_decoder.FusedCropDecoder(224)(buffer.getvalue())


def test_fused_decoder_is_picklable_and_runs_in_loader_workers(digit_shards):
    decoder = TrainPreset(24, 0.5, decoder="fused").build()
    clone = pickle.loads(pickle.dumps(decoder))
    assert clone(photo_jpeg()).shape == (3, 24, 24)
    source = resolve_source(str(digit_shards))
    stream = ShardStream(urls=source.val_urls, transform=decoder, batch_size=16, resampled=False)
    loader = EpochLoader(stream, workers=2)
    batches = list(loader)
    assert sum(len(keys) for _, _, keys in batches) == 359 and loader.corrupt_samples == 0
    assert batches[0][0].shape == (16, 3, 24, 24)


def test_unknown_decoder_is_a_one_line_error():
    config = Config()
    config.data.shards, config.loader.decoder = "shards.json", "nvjpeg"
    with pytest.raises(ImagenetTrainError, match="--decoder: expected one of simplejpeg, fused, pil"):
        checked(config)
