"""The train and evaluate commands start the workers' forkserver before they import the training code (torch,
torchvision: seconds), so that its own imports run beside theirs instead of after them."""

import argparse
import sys
import types

import pytest

from imagenet_train.commands import evaluate_cmd, train_cmd
from imagenet_train.config import Config
from imagenet_train.loading import workers

pytestmark = pytest.mark.unit


def _watch(monkeypatch: pytest.MonkeyPatch, module: str, function: str, result: object) -> list[str]:
    """Stand-ins for the forkserver's start and for `module` (not imported yet for real), noting the order."""
    events: list[str] = []
    monkeypatch.setattr(workers, "start_worker_server", lambda: events.append("forkserver"))

    def entry(*_: object) -> object:
        events.append(function)
        return result

    class Imported(types.ModuleType):
        def __getattr__(self, name: str) -> object:
            if name != function:
                raise AttributeError(name)
            events.append("imported")
            return entry

    monkeypatch.setitem(sys.modules, module, Imported(module))
    return events


@pytest.mark.parametrize(
    "workers_per_rank, expected", [(2, ["forkserver", "imported", "train"]), (0, ["imported", "train"])]
)
def test_train_starts_the_forkserver_before_it_imports_the_trainer(monkeypatch, workers_per_rank, expected):
    events = _watch(monkeypatch, "imagenet_train.main.train", "train", {})
    cfg = Config()
    cfg.loader.workers = workers_per_rank
    assert train_cmd.cmd_train(argparse.Namespace(print_config=False, config=cfg)) == 0
    assert events == expected


@pytest.mark.parametrize(
    "workers_per_rank, expected",
    [(2, ["forkserver", "imported", "evaluate_weights"]), (0, ["imported", "evaluate_weights"])],
)
def test_evaluate_starts_the_forkserver_before_it_imports_the_evaluation(
    monkeypatch, tmp_path, workers_per_rank, expected
):
    not_main = types.SimpleNamespace(is_main=False)
    events = _watch(monkeypatch, "imagenet_train.main.evaluate", "evaluate_weights", ({}, not_main))
    cfg = Config()
    cfg.loader.workers = workers_per_rank
    args = argparse.Namespace(config=cfg, weights=str(tmp_path / "w.pt"), ema=False, out="-")
    assert evaluate_cmd.cmd_evaluate(args) == 0
    assert events == expected
