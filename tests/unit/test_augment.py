"""The --auto-augment policies and RandomErasing on the uint8 crop, from torchvision.transforms.v2."""

import pytest
import torch

from imagenet_train.choices import AutoAugment
from imagenet_train.loading.augment import MEAN_PIXEL
from imagenet_train.loading.presets import TrainPreset

from conftest import jpeg_bytes

pytestmark = pytest.mark.unit


def crop(preset: TrainPreset, data: bytes, seed: int = 5) -> torch.Tensor:
    torch.manual_seed(seed)
    return preset.build()(data)


@pytest.mark.parametrize("policy", [AutoAugment.TA_WIDE, AutoAugment.RA, AutoAugment.IMAGENET])
def test_each_policy_changes_some_crops_and_keeps_uint8_chw(policy):
    data = jpeg_bytes(seed=1, size=(96, 80))
    changed = 0
    for seed in range(8):  # a policy may draw the identity for one image; not for all eight
        plain = crop(TrainPreset(64), data, seed)
        augmented = crop(TrainPreset(64, auto_augment=policy), data, seed)
        assert augmented.dtype == torch.uint8 and augmented.shape == (3, 64, 64)
        changed += not torch.equal(plain, augmented)
    assert changed >= 4


def test_random_erasing_paints_a_box_with_the_mean_pixel():
    data = jpeg_bytes(seed=2, size=(96, 80))
    plain, erased = crop(TrainPreset(64), data), crop(TrainPreset(64, random_erase=1.0), data)
    assert erased.dtype == torch.uint8 and erased.shape == plain.shape
    differs = (erased != plain).any(0)
    assert differs.any()
    assert (erased[:, differs] == torch.tensor(MEAN_PIXEL, dtype=torch.uint8)[:, None]).all()


def test_no_policy_and_no_erasing_leave_the_crop_as_it_was():
    data = jpeg_bytes(seed=3, size=(96, 80))
    assert torch.equal(crop(TrainPreset(64), data), crop(TrainPreset(64, random_erase=0.0), data))
