"""--compile with progressive resizing: each train crop size compiles one static graph, once over the run, and a
short batch compiles nothing (torch's default would turn the second size into one dynamic-shape graph)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch._dynamo

from imagenet_train.config import Config
from imagenet_train.config_checks import checked
from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.datasets.source import resolve_source
from imagenet_train.main.train import run_parts
from imagenet_train.training import step
from imagenet_train.training.dist import DistInfo
from imagenet_train.training.loop import Trainer
from imagenet_train.training.step import CompiledForward

from conftest import write_image_folder

BATCH = 8


class RecordingBackend:
    """A torch.compile backend that notes the image batch shape of every graph it is given, and whether the
    graph is static, then hands the graph to a real backend (CPU inductor, as CI runs, or eager)."""

    def __init__(self, then: str):
        self.then = torch._dynamo.lookup_backend(then)
        self.images: list[tuple[int, ...]] = []
        self.symbolic = 0

    def __call__(self, graph: torch.fx.GraphModule, inputs: list) -> object:
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        self.images += [tuple(t.shape) for t in tensors if t.dim() == 4 and t.shape[0] == BATCH and t.shape[1] == 3]
        self.symbolic += sum(not isinstance(d, int) for t in tensors for d in t.shape)
        self.symbolic += sum(isinstance(t, torch.SymInt) for t in inputs)
        return self.then(graph, inputs)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()  # another test's compiled frames would hide this one's compiles
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def two_batch_shards(tmp_path_factory) -> Path:
    """16 training images: an epoch of data is two batches of 8, whichever clock the ramp counts."""
    root = tmp_path_factory.mktemp("compile-shards")
    write_image_folder(root / "in", {"n01": 8, "n02": 8})
    convert(str(root / "in"), str(root / "shards"), ShardOptions(maxcount=8), progress=False)
    return root / "shards"


@pytest.mark.parametrize(
    "backend, device",
    [
        ("eager", "cpu"),
        # CI's own compiler: minutes on 2 cores (C++ for every kernel), so out of `make test`
        pytest.param("inductor", "cpu", marks=[pytest.mark.slow, pytest.mark.timeout(1800)]),
        pytest.param("inductor", "cuda", marks=pytest.mark.cuda),
    ],
)
def test_progressive_resizing_compiles_one_static_graph_per_crop_size_over_the_run(
    two_batch_shards, tmp_path, monkeypatch, fresh_dynamo, backend, device
):
    recorder = RecordingBackend(backend)
    monkeypatch.setattr(step, "COMPILE_BACKEND", recorder)
    cfg = Config()
    cfg.data.shards, cfg.loader.workers, cfg.loader.batch_size = str(two_batch_shards), 1, BATCH
    cfg.augment.progressive_start_size, cfg.augment.progressive_end_size = 32, 96  # 32, 64, 96 px
    cfg.augment.progressive_start_epoch, cfg.augment.progressive_end_epoch = 0, 2
    cfg.run.arch, cfg.run.compile, cfg.run.epochs, cfg.run.tensorboard = "resnet18", True, 4, False
    cfg.optim.warmup_epochs = 0
    cfg.run.run_dir = str(tmp_path / "run")
    info = DistInfo(rank=0, world=1, local_rank=0, device=torch.device(device))
    cfg = checked(cfg)
    Trainer(cfg, info, resolve_source(cfg.data.shards), run_parts(cfg, info)).run()

    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    sizes = [json.loads(line)["train_crop_size"] for line in lines]
    assert len(sizes) == 4 and len(set(sizes)) == 3, sizes  # the run did meet three sizes, one of them twice
    first_seen = list(dict.fromkeys(sizes))
    assert recorder.images == [(BATCH, 3, size, size) for size in first_seen]
    assert recorder.symbolic == 0  # every graph static: no dynamic-shape graph shared by several sizes


def test_a_short_batch_runs_uncompiled_and_sizes_beyond_the_default_cache_each_compile_once(fresh_dynamo):
    recorder = RecordingBackend("eager")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2)
    )
    sizes = [32 * k for k in range(1, 11)]  # ten sizes: torch keeps eight graphs per function by default
    forward = CompiledForward(model, BATCH, len(sizes), recorder)
    for size in [*sizes, *sizes]:
        for batch in (BATCH, BATCH, 5):
            images = torch.randn(batch, 3, size, size)
            assert torch.allclose(forward(images), model(images), atol=1e-6)
    assert recorder.images == [(BATCH, 3, size, size) for size in sizes]
    assert recorder.symbolic == 0
