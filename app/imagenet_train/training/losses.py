"""The training loss a run names (--loss): torch's CrossEntropyLoss, or timm's BinaryCrossEntropy as in ResNet
Strikes Back. Both take the hard labels of a plain batch and the soft targets MixUp/CutMix make."""

from __future__ import annotations

from typing import Any

import torch

from imagenet_train.choices import Loss
from imagenet_train.compat import require_timm


def build_criterion(optim_cfg: Any) -> torch.nn.Module:
    """The --loss criterion with --label-smoothing (and --bce-target-threshold); OptimConfig is read by name."""
    if Loss(optim_cfg.loss) is Loss.CE:
        return torch.nn.CrossEntropyLoss(label_smoothing=optim_cfg.label_smoothing)
    require_timm("--loss bce")
    from timm.loss import BinaryCrossEntropy

    # timm smooths hard labels here; soft targets (MixUp/CutMix) are taken as they are, which in timm's train.py
    # are smoothed by its own Mixup (torchvision's MixUp/CutMix, used here, do not smooth).
    threshold = optim_cfg.bce_target_threshold or None
    return BinaryCrossEntropy(smoothing=optim_cfg.label_smoothing, target_threshold=threshold)
