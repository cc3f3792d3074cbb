"""Training augmentation after the crop and flip: the --auto-augment policies, one entry each in POLICIES (how
torchvision.transforms.v2 builds it on the uint8 CHW crop, and how DALI's auto_aug does under --decoder dali),
then RandomErasing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from imagenet_train.choices import AutoAugment, Interpolation
from imagenet_train.compat import ensure_torchvision
from imagenet_train.errors import ImagenetTrainError, clip

ensure_torchvision()
from torchvision.transforms import v2  # noqa: E402

# RandomErasing runs here before normalisation; erasing to the mean pixel is what torchvision's reference
# (erasing the normalised tensor to 0) puts there.
MEAN_PIXEL = (124, 116, 104)  # round(IMAGENET_MEAN x 255)

Transform = Callable[[torch.Tensor], torch.Tensor]


def _dali_trivial_augment_wide(images: Any) -> Any:
    from nvidia.dali.auto_aug import trivial_augment

    return trivial_augment.trivial_augment_wide(images)


def _dali_rand_augment(images: Any) -> Any:
    from nvidia.dali.auto_aug import rand_augment

    return rand_augment.rand_augment(images, n=2, m=9)  # torchvision's RandAugment defaults


def _dali_auto_augment_imagenet(images: Any) -> Any:
    from nvidia.dali.auto_aug import auto_augment

    return auto_augment.auto_augment_image_net(images)


def _unchanged(images: Any) -> Any:
    return images


@dataclass(frozen=True)
class Policy:
    """One --auto-augment word: torchvision's transform for the CPU path (given the interpolation; None: no step),
    and DALI's on a batch of uint8 HWC crops (None: DALI has no such policy, so --decoder dali refuses it)."""

    cpu: Callable[[v2.InterpolationMode], Transform] | None
    dali: Callable[[Any], Any] | None


# One entry per AutoAugment member, read by the CPU path (`policy`), the DALI path (loading/dali.py) and the
# config checks (config_checks.py); adding a policy is its enum member and its entry (docs/development.md).
POLICIES: dict[AutoAugment, Policy] = {
    AutoAugment.NONE: Policy(cpu=None, dali=_unchanged),
    AutoAugment.TA_WIDE: Policy(
        cpu=lambda mode: v2.TrivialAugmentWide(interpolation=mode), dali=_dali_trivial_augment_wide
    ),
    AutoAugment.RA: Policy(cpu=lambda mode: v2.RandAugment(interpolation=mode), dali=_dali_rand_augment),
    AutoAugment.IMAGENET: Policy(
        cpu=lambda mode: v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET, interpolation=mode),
        dali=_dali_auto_augment_imagenet,
    ),
    AutoAugment.AUGMIX: Policy(cpu=lambda mode: v2.AugMix(interpolation=mode), dali=None),  # DALI has no AugMix
}


def policy_entry(name: AutoAugment | str) -> Policy:
    """The table's entry for an --auto-augment word; a word it lacks is refused in one line."""
    try:
        entry = POLICIES[AutoAugment(name)]
    except (ValueError, KeyError):  # not a word of the enum, or a word without its entry
        raise ImagenetTrainError(
            f"--auto-augment: expected one of {', '.join(str(member) for member in POLICIES)}, got '{clip(name)}'"
        ) from None
    return entry


def dali_builder(name: AutoAugment | str) -> Callable[[Any], Any]:
    """DALI's builder for an --auto-augment word (--decoder dali); one DALI lacks is refused in one line."""
    build = policy_entry(name).dali
    if build is None:
        raise ImagenetTrainError(
            f"--auto-augment {name}: not available with --decoder dali (DALI's auto_aug has no such policy); "
            "use another --decoder or another --auto-augment"
        )
    return build


def interpolation_mode(name: Interpolation | str) -> v2.InterpolationMode:
    """torchvision's InterpolationMode for an --interpolation word."""
    return v2.InterpolationMode(str(Interpolation(name)))


def policy(
    name: AutoAugment | str, interpolation: Interpolation | str = Interpolation.BILINEAR
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The --auto-augment policy as torchvision's reference builds it (its POLICIES entry), or None for none. Its
    geometric operations on a tensor take nearest or bilinear only (torchvision's affine refuses bicubic there; its
    reference, on PIL images, can), so under --interpolation bicubic the policy stays bilinear."""
    mode = interpolation_mode(interpolation)
    if mode is v2.InterpolationMode.BICUBIC:
        mode = v2.InterpolationMode.BILINEAR
    build = policy_entry(name).cpu
    return build(mode) if build else None


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
