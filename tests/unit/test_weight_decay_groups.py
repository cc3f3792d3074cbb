"""--weight-decay and its exemptions: by default timm's param_groups_weight_decay (no decay on biases, norms, other
1-D parameters and the model's no_weight_decay() names); --norm-weight-decay, --bias-weight-decay and
--transformer-embedding-decay as torchvision's train.py groups them (set_weight_decay)."""

import pytest
import torch

from imagenet_train.compat import ensure_torchvision
from imagenet_train.config import OptimConfig
from imagenet_train.training import models
from imagenet_train.training.optimizers import Decays, build_optimizer, parameter_groups

pytestmark = pytest.mark.unit


def _by_decay(model: torch.nn.Module, groups: list[dict]) -> dict[str, float]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g["weight_decay"] for g in groups for p in g["params"]}


@pytest.mark.parametrize("arch", ["timm/resnet10t", "timm/vit_tiny_patch16_224", "resnet18"])
def test_the_default_groups_are_timms_param_groups_weight_decay(arch):
    ensure_torchvision()
    from timm.optim import param_groups_weight_decay

    model = models.build_model(arch, 10)
    exempt = model.no_weight_decay() if hasattr(model, "no_weight_decay") else ()
    assert _by_decay(model, parameter_groups(model, 0.05)) == _by_decay(
        model, param_groups_weight_decay(model, 0.05, no_weight_decay_list=exempt)
    )


class TinyTransformer(torch.nn.Module):
    """torchvision's parameter names: class_token, pos_embedding; a LayerNorm, a Linear and a layer scale."""

    def __init__(self):
        super().__init__()
        self.class_token = torch.nn.Parameter(torch.zeros(1, 1, 4))
        self.encoder = torch.nn.Module()
        self.encoder.pos_embedding = torch.nn.Parameter(torch.zeros(1, 2, 4))
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 3)
        self.scale = torch.nn.Parameter(torch.ones(4))


def test_each_kind_of_parameter_takes_its_own_decay_as_torchvision_groups_them():
    model = TinyTransformer()
    decays = _by_decay(model, parameter_groups(model, Decays(0.5, norms=0.1, biases=0.2, embeddings=0.3)))
    assert decays == {
        "class_token": 0.3,
        "encoder.pos_embedding": 0.3,
        "norm.weight": 0.1,
        "norm.bias": 0.1,  # a norm's: torchvision's RN50 v2 (--norm-weight-decay 0) leaves BN biases undecayed
        "head.weight": 0.5,
        "head.bias": 0.2,
        "scale": 0.0,  # timm's rule for other one-dimensional parameters
    }


def test_the_settings_reach_the_optimizer_and_the_weights_come_first():
    model = TinyTransformer()
    cfg = OptimConfig(weight_decay=0.5, norm_weight_decay=0.5, bias_weight_decay=0.0, transformer_embedding_decay=0)
    groups = build_optimizer(cfg, model, lr=0.1).param_groups
    assert [p for p in groups[0]["params"]] == [model.head.weight]  # norms at 0.5 too, but not adapted with them
    assert _by_decay(model, groups)["norm.weight"] == 0.5


def test_default_groups_keep_the_two_groups_in_model_order_that_older_checkpoints_hold():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2))
    groups = parameter_groups(model, 0.05)
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]
    assert groups[0]["params"] == [p for p in model.parameters() if p.ndim > 1]
    assert groups[1]["params"] == [p for p in model.parameters() if p.ndim <= 1]
