"""--mixup-alpha/--cutmix-alpha: MixUp and CutMix (torchvision.transforms.v2) on a normalised device batch, as
torchvision's reference applies them: one of the two at random per batch when both are on. The labels come
back as soft targets (rows of class weights summing to 1), which CrossEntropyLoss takes as they are."""

from __future__ import annotations

from collections.abc import Callable

import torch

from imagenet_train.compat import ensure_torchvision

BatchTransform = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def batch_mixing(mixup_alpha: float, cutmix_alpha: float, num_classes: int) -> BatchTransform | None:
    """The batch transform for the given alphas (0 turns one off), or None when both are off."""
    ensure_torchvision()
    from torchvision.transforms import v2

    chosen = []
    if mixup_alpha > 0:
        chosen.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
    if cutmix_alpha > 0:
        chosen.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
    if not chosen:
        return None
    return chosen[0] if len(chosen) == 1 else v2.RandomChoice(chosen)
