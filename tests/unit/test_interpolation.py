"""--interpolation: the training crop's resize, the augmentation policy and the evaluation resize take it (bicubic
for timm's and the ViT/EfficientNet figures); the fused decoder's final resize and DALI's fn.resize too."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from imagenet_train.cli import build_parser
from imagenet_train.commands.train_cmd import _config_from
from imagenet_train.compat import ensure_torchvision
from imagenet_train.loading.augment import policy
from imagenet_train.loading.fused_decoder import FusedCropDecoder
from imagenet_train.loading.fused_decoder import available as fused_available
from imagenet_train.loading.presets import TrainPreset, ValPreset, decode_rgb

ensure_torchvision()
from torchvision.transforms.v2 import functional  # noqa: E402

pytestmark = pytest.mark.unit
BICUBIC, BILINEAR = functional.InterpolationMode.BICUBIC, functional.InterpolationMode.BILINEAR


def _jpeg(side: int = 96) -> bytes:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (side // 8, side // 8, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=95)
    return out.getvalue()


@pytest.mark.parametrize("decoder", ["simplejpeg", "fused"])
def test_the_training_crop_resizes_with_the_interpolation_asked_for(decoder):
    if decoder == "fused" and not fused_available():
        pytest.skip("libturbojpeg not installed")
    data = _jpeg()
    # Scale 1 on a square image: the crop is the whole image, so only the resize decides the pixels; enlarged, so
    # the fused decoder's DCT scaling (by 1) changes nothing.
    crops = {
        mode: TrainPreset(128, min_scale=1.0, hflip=False, decoder=decoder, interpolation=mode).build()(data)
        for mode in ("bilinear", "bicubic")
    }
    image = decode_rgb(data)
    for mode, torch_mode in (("bilinear", BILINEAR), ("bicubic", BICUBIC)):
        expected = functional.resize(image, [128, 128], interpolation=torch_mode, antialias=True)
        assert torch.equal(crops[mode], expected)
    assert not torch.equal(crops["bilinear"], crops["bicubic"])


def test_the_evaluation_resize_takes_the_interpolation():
    data, image = _jpeg(), decode_rgb(_jpeg())
    val = ValPreset(32, resize=40, interpolation="bicubic").build()(data)
    resized = functional.resize(image, 40, interpolation=BICUBIC, antialias=True)
    assert torch.equal(val, functional.center_crop(resized, [32, 32]))


def test_the_policy_runs_under_bicubic_and_the_flag_reaches_the_config():
    # torchvision's tensor affine takes no bicubic: the policy stays bilinear and runs on every uint8 crop.
    torch.manual_seed(0)
    crop = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
    for name in ("ra", "ta_wide", "imagenet"):
        chosen = policy(name, "bicubic")
        assert chosen.interpolation == BILINEAR
        assert all(chosen(crop).shape == crop.shape for _ in range(30))
    cfg = _config_from(build_parser().parse_args(["train", "--shards", "x", "--interpolation", "bicubic"]))
    assert cfg.augment.interpolation == "bicubic"
    assert FusedCropDecoder(32, interpolation="bicubic").at_size(48).interpolation == "bicubic"
