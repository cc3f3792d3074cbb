"""timm's models as timm's train.py makes them: its zero-init default (tested in test_models), --drop-path as
timm's drop_path_rate and torchvision's stochastic_depth_prob, the embeddings timm exempts from weight decay, and
the square-root LR scaling timm gives adaptive optimizers."""

import pytest
import torch

from imagenet_train.choices import Opt
from imagenet_train.compat import ensure_torchvision
from imagenet_train.config import Config
from imagenet_train.config_checks import checked
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.planning.schedule import Schedule
from imagenet_train.training import models
from imagenet_train.training.optimizers import parameter_groups

pytestmark = pytest.mark.unit


def _drop_rates(model: torch.nn.Module) -> list[float]:
    ensure_torchvision()
    from timm.layers import DropPath
    from torchvision.ops import StochasticDepth

    return [
        m.drop_prob if isinstance(m, DropPath) else m.p
        for m in model.modules()
        if isinstance(m, (DropPath, StochasticDepth))
    ]


def test_drop_path_reaches_timms_drop_path_rate_and_is_off_by_timms_default():
    rates = _drop_rates(models.build_model("timm/resnet10t", 10, drop_path=0.1))
    assert rates and max(rates) == pytest.approx(0.1)  # timm's ResNet scales the rate up to the last block
    assert not any(_drop_rates(models.build_model("timm/resnet10t", 10)))


def test_drop_path_reaches_torchvisions_stochastic_depth_and_minus_one_keeps_the_builders_default():
    assert max(_drop_rates(models.build_model("efficientnet_b0", 10, drop_path=0.05))) < 0.05
    assert max(_drop_rates(models.build_model("efficientnet_b0", 10, drop_path=0.05))) > 0.04
    assert max(_drop_rates(models.build_model("efficientnet_b0", 10))) > 0.15  # the builder's 0.2


@pytest.mark.parametrize("arch", ["resnet18", "swin_t"])
def test_drop_path_on_a_torchvision_model_without_it_is_one_line(arch):
    with pytest.raises(ImagenetTrainError) as error:
        models.build_model(arch, 10, drop_path=0.1)
    assert str(error.value).startswith(f"--drop-path: torchvision's {arch} takes no stochastic_depth_prob")


def test_drop_path_between_minus_one_and_zero_is_refused_in_one_line():
    cfg = Config()
    cfg.data.shards, cfg.run.drop_path = "shards.json", -0.5
    with pytest.raises(ImagenetTrainError, match=r"^--drop-path: expected -1 \(the model's default\)"):
        checked(cfg)


def test_a_timm_vits_position_embedding_and_class_token_are_not_decayed():
    model = models.build_model("timm/vit_tiny_patch16_224", 10)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for g in parameter_groups(model, 0.05) if g["weight_decay"] for p in g["params"]}
    assert "patch_embed.proj.weight" in decayed
    assert not decayed & {"pos_embed", "cls_token"}


def _base_lr(opt: Opt, global_batch: int, lr: float = 1e-3) -> float:
    cfg = Config()
    cfg.optim.opt, cfg.optim.lr, cfg.loader.batch_size = opt.value, lr, global_batch // 4
    return Schedule.of(cfg, train_samples=100_000, train_sizes=None, world=4).base_lr


@pytest.mark.parametrize(("opt", "factor"), [(Opt.SGD, 16.0), (Opt.LARS, 16.0), (Opt.ADAMW, 4.0), (Opt.LAMB, 4.0)])
def test_the_lr_scales_linearly_for_sgd_and_lars_and_by_the_square_root_for_adamw_and_lamb(opt, factor):
    # timm's train.py: lr = lr_base x (global batch / 256), square-rooted for 'ada' and 'lamb' optimizers.
    assert _base_lr(opt, 4096) == pytest.approx(1e-3 * factor)
    assert _base_lr(opt, 256) == pytest.approx(1e-3)
