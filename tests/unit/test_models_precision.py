"""A timm model trains as torchvision's do: channels_last, autocast bf16 on the CPU, and torch.compile."""

from __future__ import annotations

import pytest
import torch

from imagenet_train.config import RunConfig
from imagenet_train.training import models

pytestmark = pytest.mark.unit


def _step(model: torch.nn.Module, forward) -> torch.Tensor:
    """One forward+backward of a channels_last batch under bf16 autocast; returns the logits."""
    images = torch.randn(4, 3, 32, 32).to(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = forward(images)
        loss = torch.nn.functional.cross_entropy(logits, torch.arange(4))
    loss.backward()
    return logits


@pytest.mark.parametrize("blurpool", [False, True], ids=["plain", "blurpool"])
def test_timm_model_steps_channels_last_under_bf16_autocast(blurpool):
    model = models.create(RunConfig(arch="timm/resnet18d", zero_init_residual=True, blurpool=blurpool), 4)
    model = model.to(memory_format=torch.channels_last)
    logits = _step(model, model)
    assert logits.dtype == torch.bfloat16 and logits.shape == (4, 4)
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.conv1[0].weight.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.slow  # inductor compiles forward and backward: 2.5 minutes cold on 2 shared CPU cores
def test_timm_model_steps_under_torch_compile():
    model = models.create(RunConfig(arch="timm/test_resnet", zero_init_residual=True), 4)
    model = model.to(memory_format=torch.channels_last)
    logits = _step(model, torch.compile(model))
    assert logits.shape == (4, 4)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
