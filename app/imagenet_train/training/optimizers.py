"""The optimizer of a run, from well-kept implementations (torch.optim's SGD and AdamW, timm.optim's LARS and
LAMB), with biases and normalisation parameters kept out of weight decay and out of LARS/LAMB's trust ratio."""

from __future__ import annotations

from typing import Any

import torch

from imagenet_train.compat import require_timm
from imagenet_train.planning.optimization import Opt


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on weights only: not on biases and normalisation parameters (those with one dimension)."""
    decay, no_decay = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (no_decay if parameter.ndim <= 1 else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(optim_cfg: Any, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """The --opt optimizer over `model`'s parameters at `lr` (the run's OptimConfig is read by name)."""
    opt = Opt(optim_cfg.opt)
    groups = parameter_groups(model, optim_cfg.weight_decay)
    if opt is Opt.SGD:
        return torch.optim.SGD(groups, lr=lr, momentum=optim_cfg.momentum, nesterov=optim_cfg.nesterov)
    if opt is Opt.ADAMW:
        return torch.optim.AdamW(groups, lr=lr)
    require_timm(f"--opt {opt}")
    from timm.optim import Lamb, Lars

    # timm adapts a group's LR by its trust ratio only where the group decays, unless always_adapt: say it per
    # group, so weights are adapted even under --weight-decay 0 and biases and norms never are.
    weights, others = groups
    weights["always_adapt"], others["always_adapt"] = True, False
    if opt is Opt.LARS:
        return Lars(groups, lr=lr, momentum=optim_cfg.momentum, nesterov=optim_cfg.nesterov)
    return Lamb(groups, lr=lr)
