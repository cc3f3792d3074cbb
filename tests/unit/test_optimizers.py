"""--opt: every optimizer takes a step that moves the weights, biases and norms never decay (nor, under LARS and
LAMB, get a trust ratio), and LARS/LAMB without timm is one line naming the flag."""

import sys

import pytest
import torch

from imagenet_train.choices import Opt
from imagenet_train.compat import require_timm
from imagenet_train.config import Config, OptimConfig
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.main.entry_checks import runnable
from imagenet_train.training.optimizers import build_optimizer

pytestmark = pytest.mark.unit


def optim(opt: Opt, weight_decay: float = 0.05, nesterov: bool = False) -> OptimConfig:
    return OptimConfig(opt=opt.value, weight_decay=weight_decay, momentum=0.9, nesterov=nesterov)


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64, 3)
    )


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize(("opt", "nesterov"), [(o, False) for o in Opt] + [(Opt.SGD, True), (Opt.LARS, True)])
def test_every_optimizer_takes_a_step_that_changes_every_parameter(opt, nesterov):
    model = small_model()
    optimizer = build_optimizer(optim(opt, nesterov=nesterov), model, lr=0.1)
    before = snapshot(model)
    images, labels = torch.randn(8, 3, 6, 6), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert not unchanged, f"--opt {opt}: {unchanged} did not move"


@pytest.mark.parametrize("opt", list(Opt))
def test_with_no_gradient_only_the_weights_decay_never_biases_or_norms(opt):
    model = small_model()
    optimizer = build_optimizer(optim(opt), model, lr=0.1)
    before = snapshot(model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for name, p in model.named_parameters():
        if p.ndim > 1:
            assert p.norm() < before[name].norm(), f"--opt {opt}: weight {name} did not decay"
        else:
            assert torch.equal(p, before[name]), f"--opt {opt}: {name} (a bias or norm) decayed"


def test_lars_adapts_the_weights_by_their_trust_ratio_but_not_biases_and_norms():
    model = small_model()
    optimizer = build_optimizer(optim(Opt.LARS, weight_decay=0.0), model, lr=0.1)  # adapted even without decay
    before = snapshot(model)
    model(torch.randn(8, 3, 6, 6)).square().mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    optimizer.step()
    for name, p in model.named_parameters():
        plain_sgd = before[name] - 0.1 * grads[name]  # the first momentum step is the gradient itself
        if p.ndim > 1:
            assert not torch.allclose(p, plain_sgd), f"{name}: no trust ratio applied to a weight"
        else:
            assert torch.allclose(p, plain_sgd), f"{name}: a bias or norm got a trust ratio"


def test_lamb_and_lars_without_timm_are_one_line_naming_the_flag(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` now fails as if it were not installed
    monkeypatch.setitem(sys.modules, "timm.optim", None)
    with pytest.raises(ImagenetTrainError, match=r"^--opt lars: needs timm \(pip install 'imagenet-train\[timm\]'\)$"):
        require_timm("--opt lars")
    cfg = Config()
    cfg.data.shards, cfg.optim.opt = "shards.json", "lamb"
    with pytest.raises(ImagenetTrainError, match="^--opt lamb: needs timm"):
        runnable(cfg)
    with pytest.raises(ImagenetTrainError, match="^--opt lamb: needs timm"):
        build_optimizer(optim(Opt.LAMB), small_model(), lr=0.1)
    cfg.optim.opt = "adamw"
    runnable(cfg)  # torch's own optimizers need nothing more


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"opt": "adamw", "nesterov": True}, "--nesterov: applies to --opt sgd and lars"),
        ({"nesterov": True, "momentum": 0.0}, "--nesterov: needs a momentum"),
        ({"warmup_epochs": -0.5}, "--warmup-epochs: expected -1 (auto) or a number >= 0"),
        ({"opt": "adamw", "mode": "split"}, "--opt adamw: --mode split keeps replicas in step"),
    ],
)
def test_settings_that_cannot_work_together_are_refused_in_one_line(changes, message):
    cfg = Config()
    cfg.data.shards = "shards.json"
    for key, value in changes.items():
        setattr(next(s for s in cfg.sections() if hasattr(s, key)), key, value)
    with pytest.raises(ImagenetTrainError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        runnable(cfg)
