"""The optimizer of a run: its parameter groups by kind (weights, norms, biases, embeddings: each its own weight
decay, as torchvision's and timm's train.py group them) and the --opt optimizer over them."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch

from imagenet_train.choices import Opt
from imagenet_train.compat import require_timm
from imagenet_train.config import OptimConfig

# torchvision's train.py --transformer-embedding-decay keys (a parameter's own name), and torchvision ViT's
# pos_embedding, which that list misses ("position_embedding" names no torchvision parameter).
TORCHVISION_EMBEDDINGS = ("class_token", "position_embedding", "relative_position_bias_table", "pos_embedding")
NORM_CLASSES = (  # torchvision's set_weight_decay's
    torch.nn.modules.batchnorm._BatchNorm,
    torch.nn.LayerNorm,
    torch.nn.GroupNorm,
    torch.nn.modules.instancenorm._InstanceNorm,
    torch.nn.LocalResponseNorm,
)


@dataclass(frozen=True)
class Decays:
    """The weight decay of each kind of parameter (the run's --*-weight-decay settings)."""

    weights: float
    norms: float = 0.0
    biases: float = 0.0
    embeddings: float = 0.0

    @classmethod
    def of(cls, optim_cfg: OptimConfig) -> Decays:
        """The decays a run's OptimConfig names."""
        return cls(
            optim_cfg.weight_decay,
            optim_cfg.norm_weight_decay,
            optim_cfg.bias_weight_decay,
            optim_cfg.transformer_embedding_decay,
        )


def parameter_groups(model: torch.nn.Module, decays: Decays | float) -> list[dict]:
    """The parameters grouped by weight decay, as torchvision's set_weight_decay with timm's exemptions.

    First match wins: transformer embeddings (timm's model.no_weight_decay() names, torchvision's keys),
    normalisation layers' parameters, the other biases, then every other one-dimensional parameter at no decay
    (timm's param_groups_weight_decay rule: layer scales, say), and the rest at --weight-decay. Norms before
    biases reproduces torchvision's recipes that set --norm-weight-decay alone (RN50 v2: BN biases 0, the
    classifier's bias decayed); torchvision differs only where both are set apart (its bias key wins there).
    With the default decays (all 0) this is timm's param_groups_weight_decay. The first group holds the weights
    (the ones LARS and LAMB adapt)."""
    decays = decays if isinstance(decays, Decays) else Decays(decays)
    exempt = getattr(model, "no_weight_decay", None)  # timm's models name their embeddings here
    timm_embeddings = tuple(exempt()) if callable(exempt) else ()
    # Keyed by (decay, adapted): the weights' group first, then one group per other decay, so the default run
    # has the two groups (weights, then the rest in model order) that checkpoints of earlier versions hold.
    groups: dict[tuple[float, bool], list] = {(decays.weights, True): []}
    for module_name, module in model.named_modules():
        for name, parameter in module.named_parameters(recurse=False):
            if not parameter.requires_grad:
                continue
            full = f"{module_name}.{name}" if module_name else name
            if name in TORCHVISION_EMBEDDINGS or any(fnmatch.fnmatch(full, p) for p in timm_embeddings):
                key = (decays.embeddings, False)
            elif isinstance(module, NORM_CLASSES):
                key = (decays.norms, False)
            elif name == "bias":
                key = (decays.biases, False)
            else:
                key = (decays.weights, True) if parameter.ndim > 1 else (0.0, False)
            groups.setdefault(key, []).append(parameter)
    return [{"params": params, "weight_decay": decay} for (decay, _), params in groups.items() if params]


def build_optimizer(optim_cfg: OptimConfig, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    """The --opt optimizer over `model`'s parameters at `lr`."""
    opt = Opt(optim_cfg.opt)
    groups = parameter_groups(model, Decays.of(optim_cfg))
    # None leaves torch its default (foreach on CUDA); fused is refused for the others by config_checks.
    fused = True if optim_cfg.fused_optimizer else None
    if opt is Opt.SGD:
        return torch.optim.SGD(groups, lr=lr, momentum=optim_cfg.momentum, nesterov=optim_cfg.nesterov, fused=fused)
    if opt is Opt.ADAMW:
        return torch.optim.AdamW(groups, lr=lr, fused=fused)
    require_timm(f"--opt {opt}")
    from timm.optim import Lamb, Lars

    # timm adapts a group's LR by its trust ratio only where the group decays, unless always_adapt: say it per
    # group, so weights are adapted even under --weight-decay 0 and biases, norms and embeddings never are.
    for index, group in enumerate(groups):
        group["always_adapt"] = index == 0  # the weights' group comes first
    if opt is Opt.LARS:
        return Lars(groups, lr=lr, momentum=optim_cfg.momentum, nesterov=optim_cfg.nesterov)
    return Lamb(groups, lr=lr)


def keep_kernels(optimizer: torch.optim.Optimizer, fused: bool) -> None:
    """After a checkpoint's load_state_dict: the run's --fused-optimizer, not the checkpoint's (torch copies the
    saved groups' `fused` and `foreach` over the ones the optimizer was built with, so a resume would silently
    keep the kernel of the run that wrote the checkpoint)."""
    if not isinstance(optimizer, (torch.optim.SGD, torch.optim.AdamW)):  # timm's LARS and LAMB have one kernel
        return
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = (True if fused else None), None
