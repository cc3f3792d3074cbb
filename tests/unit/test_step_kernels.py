"""The GPU step's kernels: --compile-mode reaches torch.compile (a CUDA-graph mode marks each step's start),
--fused-optimizer gives torch's fused SGD/AdamW the same update as its default, and both refuse what they cannot
apply in one line."""

from __future__ import annotations

import pytest
import torch

from imagenet_train.choices import CompileMode, Opt
from imagenet_train.config import Config
from imagenet_train.config_checks import check_combinations
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.training import step
from imagenet_train.training.optimizers import build_optimizer, keep_kernels
from imagenet_train.training.step import CompiledForward


class CompileSpy:
    """Stands in for torch.compile: notes the options it was given and compiles with the eager backend."""

    def __init__(self):
        self.options: list[dict] = []

    def __call__(self, module, **options):
        self.options.append(options)
        return torch._dynamo.optimize("eager")(module)


@pytest.fixture
def spy(monkeypatch) -> CompileSpy:
    found = CompileSpy()
    monkeypatch.setattr(step.torch, "compile", found)
    return found


@pytest.mark.parametrize("mode", [CompileMode.REDUCE_OVERHEAD, CompileMode.MAX_AUTOTUNE])
def test_a_cuda_graph_mode_reaches_torch_compile_and_marks_each_full_batch_step(spy, monkeypatch, mode):
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    forward = CompiledForward(torch.nn.Linear(3, 2), batch_size=4, sizes=1, mode=mode)
    assert spy.options[-1]["mode"] == str(mode) and spy.options[-1]["dynamic"] is False
    forward(torch.randn(4, 3))
    forward(torch.randn(3, 3))  # a short batch runs uncompiled: no graph step
    assert marks == [1]


def test_the_default_mode_and_the_no_graph_mode_do_not_mark_steps(spy, monkeypatch):
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    CompiledForward(torch.nn.Linear(3, 2), 4, 1)(torch.randn(4, 3))
    assert spy.options[-1]["mode"] is None  # torch's own default
    CompiledForward(torch.nn.Linear(3, 2), 4, 1, mode=CompileMode.MAX_AUTOTUNE_NO_CUDAGRAPHS)(torch.randn(4, 3))
    assert spy.options[-1]["mode"] == "max-autotune-no-cudagraphs"
    assert marks == []


def test_another_backend_takes_no_mode(spy):
    CompiledForward(torch.nn.Linear(3, 2), 4, 1, backend="eager", mode=CompileMode.REDUCE_OVERHEAD)
    assert spy.options[-1]["mode"] is None


@pytest.mark.parametrize("opt", [Opt.SGD, Opt.ADAMW])
def test_the_fused_optimizer_takes_the_default_optimizers_steps(opt):
    cfg = Config()
    cfg.optim.opt, cfg.optim.momentum = opt, 0.9
    weights = []
    for fused in (False, True):
        torch.manual_seed(0)
        # No BatchNorm after a bias: its gradient is rounding noise, which Adam scales up to a full step.
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        cfg.optim.fused_optimizer = fused
        optimizer = build_optimizer(cfg.optim, model, 0.1)
        assert optimizer.defaults["fused"] is (True if fused else None)
        data = torch.Generator().manual_seed(1)
        for _ in range(5):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(torch.randn(16, 8, generator=data)), torch.arange(16) % 3)
            loss.backward()
            optimizer.step()
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert (weights[0] - weights[1]).abs().max() < 1e-5  # float32 rounding of the same arithmetic, reordered


def test_a_compile_mode_without_compile_is_refused_in_one_line():
    cfg = Config()
    cfg.data.shards, cfg.run.compile_mode = "/data/shards.json", CompileMode.REDUCE_OVERHEAD
    with pytest.raises(ImagenetTrainError) as refused:
        check_combinations(cfg)
    assert str(refused.value) == "--compile-mode reduce-overhead: applies under --compile; add --compile or drop it"


def test_the_fused_optimizer_with_an_optimizer_torch_does_not_fuse_is_refused_in_one_line():
    cfg = Config()
    cfg.data.shards, cfg.optim.opt, cfg.optim.fused_optimizer = "/data/shards.json", Opt.LARS, True
    with pytest.raises(ImagenetTrainError, match=r"^--fused-optimizer: torch fuses --opt sgd or adamw, not --opt lars"):
        check_combinations(cfg)


@pytest.mark.parametrize("fused", [True, False])
def test_a_resumed_run_takes_its_own_fused_optimizer_setting_not_the_checkpoints(fused):
    cfg = Config()
    model = torch.nn.Linear(4, 2)
    cfg.optim.fused_optimizer = not fused
    saved = build_optimizer(cfg.optim, model, 0.1).state_dict()  # written by a run with the other setting
    cfg.optim.fused_optimizer = fused
    optimizer = build_optimizer(cfg.optim, model, 0.1)
    optimizer.load_state_dict(saved)
    assert optimizer.param_groups[0]["fused"] is (None if fused else True)  # torch took the checkpoint's
    keep_kernels(optimizer, fused)
    assert all(group["fused"] is (True if fused else None) for group in optimizer.param_groups)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()  # the kernel it was built for runs
