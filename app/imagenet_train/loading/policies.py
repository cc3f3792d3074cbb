"""The --auto-augment policies: one table, POLICIES, with each word's torchvision.transforms.v2 builder (the CPU
path, loading/augment.py) and its nvidia.dali.auto_aug builder (--decoder dali, loading/dali.py), or None where DALI
has none. The entry points' checks read it too (loading/installed.py), so it imports neither torch nor DALI: the
builders are handed torchvision's v2 module, or import DALI, when they are called."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from imagenet_train.choices import AutoAugment
from imagenet_train.errors import ImagenetTrainError, clip


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
    """One --auto-augment word: `cpu` builds torchvision's transform from (torchvision.transforms.v2, the
    interpolation mode), None for no step; `dali` applies DALI's to a batch of uint8 HWC crops, None where DALI has
    no such policy (--decoder dali refuses it)."""

    cpu: Callable[[ModuleType, Any], Callable[[Any], Any]] | None
    dali: Callable[[Any], Any] | None


# One entry per AutoAugment member; adding a policy is its enum member and its entry (docs/development.md).
POLICIES: dict[AutoAugment, Policy] = {
    AutoAugment.NONE: Policy(cpu=None, dali=_unchanged),
    AutoAugment.TA_WIDE: Policy(
        cpu=lambda v2, mode: v2.TrivialAugmentWide(interpolation=mode), dali=_dali_trivial_augment_wide
    ),
    AutoAugment.RA: Policy(cpu=lambda v2, mode: v2.RandAugment(interpolation=mode), dali=_dali_rand_augment),
    AutoAugment.IMAGENET: Policy(
        cpu=lambda v2, mode: v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET, interpolation=mode),
        dali=_dali_auto_augment_imagenet,
    ),
    AutoAugment.AUGMIX: Policy(cpu=lambda v2, mode: v2.AugMix(interpolation=mode), dali=None),  # DALI has no AugMix
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
