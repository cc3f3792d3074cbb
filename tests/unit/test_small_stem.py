"""--stem small: a ResNet's 7x7 stride-2 stem and max-pool become a 3x3 stride-1 conv, for images of 64 px or less."""

from __future__ import annotations

import pytest
import torch

from imagenet_train.choices import Stem
from imagenet_train.compat import ensure_torchvision
from imagenet_train.config import RunConfig
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.training import models

ensure_torchvision()

pytestmark = pytest.mark.unit


def _first_block_input(model: torch.nn.Module, side: int) -> tuple[int, ...]:
    """The shape of what reaches the model's first residual stage for one side x side image."""
    seen = []
    handle = model.layer1.register_forward_pre_hook(lambda _module, args: seen.append(tuple(args[0].shape)))
    model.eval()
    with torch.no_grad():
        logits = model(torch.randn(1, 3, side, side))
    handle.remove()
    assert logits.shape == (1, 10)
    return seen[0]


@pytest.mark.parametrize("arch", ["resnet18", "timm/resnet10t", "timm/resnet18d"])
def test_small_stem_keeps_the_full_resolution_into_the_first_block(arch):
    imagenet = models.architecture(RunConfig(arch=arch), 10)
    small = models.architecture(RunConfig(arch=arch, stem=Stem.SMALL.value), 10)
    assert _first_block_input(imagenet, 32)[2:] == (8, 8)
    channels = _first_block_input(small, 32)[1]
    assert _first_block_input(small, 32) == (1, channels, 32, 32)
    assert isinstance(small.maxpool, torch.nn.Identity)
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1)


def test_small_stem_changes_only_the_first_convolutions_parameters():
    imagenet = models.architecture(RunConfig(arch="resnet18"), 10)
    small = models.architecture(RunConfig(arch="resnet18", stem="small"), 10)
    count = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    assert count(imagenet) - count(small) == 64 * 3 * (7 * 7 - 3 * 3)
    assert {k for k in imagenet.state_dict()} == {k for k in small.state_dict()}


def test_a_few_steps_on_the_small_stem_lower_the_loss():
    torch.manual_seed(0)
    model = models.architecture(RunConfig(arch="resnet18", stem="small"), 10)
    images, labels = torch.randn(10, 3, 8, 8), torch.arange(10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_small_stem_with_blurpool_blurs_the_strided_convolutions_only():
    model = models.architecture(RunConfig(arch="resnet18", stem="small", blurpool=True), 10)
    assert isinstance(model.conv1, torch.nn.Conv2d)  # stride 1: nothing to blur
    assert isinstance(model.layer2[0].conv1, torch.nn.Sequential)


def test_small_stem_on_a_network_without_a_resnet_stem_is_one_line():
    with pytest.raises(ImagenetTrainError) as error:
        models.architecture(RunConfig(arch="mobilenet_v3_small", stem="small"), 10)
    text = str(error.value)
    assert "\n" not in text
    assert text.startswith("--stem small: --arch mobilenet_v3_small has no ResNet stem")


def test_weights_of_the_imagenet_stem_do_not_load_into_the_small_one(tmp_path):
    torch.save(models.architecture(RunConfig(arch="resnet18"), 10).state_dict(), tmp_path / "w.pt")
    small = models.architecture(RunConfig(arch="resnet18", stem="small"), 10)
    with pytest.raises(ImagenetTrainError, match=r"conv1.weight is \[64, 3, 7, 7\] not \[64, 3, 3, 3\]"):
        models.load_into(small, tmp_path / "w.pt")


def test_resnet_width_narrows_every_stage_of_a_timm_resnet():
    wide = models.architecture(RunConfig(arch="timm/resnet18", stem="small"), 10)
    narrow = models.architecture(RunConfig(arch="timm/resnet18", stem="small", resnet_width=16), 10)
    assert [narrow.get_submodule(f"layer{i}")[-1].conv2.out_channels for i in (1, 2, 3, 4)] == [16, 32, 64, 128]
    assert narrow.get_classifier().in_features == 128
    count = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    assert count(narrow) < count(wide) / 10
    assert _first_block_input(narrow, 28)[2:] == (28, 28)


@pytest.mark.parametrize("arch", ["resnet18", "timm/vit_tiny_patch16_224", "timm/nosuchnet"])
def test_resnet_width_on_anything_but_a_timm_resnet_is_one_line(arch):
    with pytest.raises(ImagenetTrainError, match=r"^--resnet-width 16: applies to timm's ResNets") as error:
        models.architecture(RunConfig(arch=arch, resnet_width=16), 10)
    assert "\n" not in str(error.value)
