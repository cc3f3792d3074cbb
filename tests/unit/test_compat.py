"""torchvision imports next to CPU torch, with or without its compiled extension."""

import torch

from imagenet_train.compat import ensure_torchvision, torchvision_extension_loads


def test_torchvision_models_and_transforms_work_here():
    shimmed = ensure_torchvision()
    assert shimmed == (not torchvision_extension_loads())
    import torchvision
    from torchvision.transforms import v2

    model = torchvision.models.get_model("resnet18", num_classes=3)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 3)
    crop = v2.RandomResizedCrop(16, antialias=True)(torch.zeros(3, 40, 30, dtype=torch.uint8))
    assert crop.shape == (3, 16, 16)


def test_shim_is_idempotent():
    assert ensure_torchvision() == ensure_torchvision()
