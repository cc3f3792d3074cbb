"""Training augmentation after the crop and flip, from torchvision.transforms.v2 on the uint8 CHW tensor: the
--auto-augment policy (its entry in loading/policies.py's POLICIES), then RandomErasing."""

from __future__ import annotations

from collections.abc import Callable

import torch

from imagenet_train.choices import AutoAugment, Interpolation
from imagenet_train.compat import ensure_torchvision
from imagenet_train.loading.policies import policy_entry

ensure_torchvision()
from torchvision.transforms import v2  # noqa: E402

# RandomErasing runs here before normalisation; erasing to the mean pixel is what torchvision's reference
# (erasing the normalised tensor to 0) puts there.
MEAN_PIXEL = (124, 116, 104)  # round(IMAGENET_MEAN x 255)


def interpolation_mode(name: Interpolation | str) -> v2.InterpolationMode:
    """torchvision's InterpolationMode for an --interpolation word."""
    return v2.InterpolationMode(str(Interpolation(name)))


def policy(
    name: AutoAugment | str, interpolation: Interpolation | str = Interpolation.BILINEAR
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The --auto-augment policy as torchvision's reference builds it (its loading.policies entry), or None. Its
    geometric operations on a tensor take nearest or bilinear only (torchvision's affine refuses bicubic there; its
    reference, on PIL images, can), so under --interpolation bicubic the policy stays bilinear."""
    mode = interpolation_mode(interpolation)
    if mode is v2.InterpolationMode.BICUBIC:
        mode = v2.InterpolationMode.BILINEAR
    build = policy_entry(name).cpu
    return build(v2, mode) if build else None


def after_crop(
    name: AutoAugment | str, erase: float, interpolation: Interpolation | str = Interpolation.BILINEAR
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What runs on the uint8 crop: the policy, then RandomErasing with probability `erase` (None: nothing)."""
    steps = [step for step in (policy(name, interpolation),) if step is not None]
    if erase:
        steps.append(v2.RandomErasing(p=erase, value=list(MEAN_PIXEL)))
    if not steps:
        return None
    return steps[0] if len(steps) == 1 else v2.Compose(steps)
