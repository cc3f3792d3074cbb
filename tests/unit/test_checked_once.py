"""The entry checks run once, at the boundary: `runnable` hands back a RunnableConfig, the type `train()` and
`evaluate_weights()` take, and a plain Config handed to either is refused in one line instead of checked again."""

import dataclasses
import pickle

import pytest

from imagenet_train import cli
from imagenet_train.cli import build_parser
from imagenet_train.commands.train_cmd import _config_from
from imagenet_train.config import Config
from imagenet_train.main import entry_checks
from imagenet_train.main import train as train_module
from imagenet_train.main.entry_checks import RunnableConfig, UncheckedConfig, runnable
from imagenet_train.main.evaluate import evaluate_weights

from conftest import refusal

pytestmark = pytest.mark.unit


class Started(Exception):
    """Raised where the run would begin: the first thing `train` does once its Config is accepted."""


def config_of(*flags: str) -> Config:
    return _config_from(build_parser().parse_args(["train", *flags]))


@pytest.fixture
def checks_counted(monkeypatch) -> list[Config]:
    """Every Config the settings' checks (config_checks.checked, through `runnable`) are run on."""
    seen: list[Config] = []
    real = entry_checks.checked

    def counted(cfg: Config) -> Config:
        seen.append(cfg)
        return real(cfg)

    monkeypatch.setattr(entry_checks, "checked", counted)
    return seen


@pytest.fixture
def run_begins(monkeypatch) -> None:
    """`train` stops with Started where the run would begin (its stop-signal handler, before any process group)."""

    def started() -> None:
        raise Started

    monkeypatch.setattr(train_module, "StopRequest", started)


def test_a_cli_train_runs_the_entry_checks_once(checks_counted, run_begins, tmp_path):
    with pytest.raises(Started):
        cli.main(["train", "--shards", "x", "--workers", "0", "--run-dir", str(tmp_path / "run")])
    assert len(checks_counted) == 1


def test_train_refuses_a_config_the_entry_checks_have_not_seen(checks_counted, run_begins, tmp_path):
    cfg = config_of("--shards", "x", "--workers", "0", "--run-dir", str(tmp_path / "run"))
    message = refusal(lambda: train_module.train(cfg))
    assert message.startswith("train: the Config has not been through the entry checks, or was changed after them; ")
    assert "runnable(cfg)" in message
    assert checks_counted == [] and not (tmp_path / "run").exists()


def test_train_takes_the_config_runnable_hands_back(run_begins, tmp_path):
    cfg = runnable(config_of("--shards", "x", "--workers", "0", "--run-dir", str(tmp_path / "run")))
    with pytest.raises(Started):
        train_module.train(cfg)


def test_evaluate_weights_refuses_an_unchecked_config_before_reading_the_weights(tmp_path):
    cfg = config_of("--shards", "x", "--workers", "0")
    message = refusal(lambda: evaluate_weights(cfg, tmp_path / "absent.pt"))
    assert message.startswith("evaluate_weights: the Config has not been through the entry checks, or was changed ")


def test_runnable_hands_back_every_setting_as_a_copy_the_caller_cannot_change(checks_counted):
    cfg = config_of("--shards", "x", "--batch-size", "16", "--auto-augment", "ra")
    checked = runnable(cfg)
    assert isinstance(checked, RunnableConfig) and not isinstance(cfg, RunnableConfig)
    assert dataclasses.asdict(checked) == dataclasses.asdict(cfg)
    cfg.loader.batch_size = 0  # out of range: a change after the checks
    assert checked.loader.batch_size == 16
    assert len(checks_counted) == 1


def test_a_checked_config_stays_checked_when_divided_over_the_world():
    checked = runnable(config_of("--shards", "x", "--global-batch-size", "64"))
    per_rank = checked.for_world(4)
    assert isinstance(per_rank, RunnableConfig) and per_rank.loader.batch_size == 16


@pytest.mark.parametrize("how", ["changed after the checks", "made without them"])
def test_train_refuses_a_runnable_config_changed_since_or_made_by_hand(checks_counted, run_begins, tmp_path, how):
    cfg = runnable(config_of("--shards", "x", "--workers", "0", "--run-dir", str(tmp_path / "run")))
    if how == "changed after the checks":
        cfg.loader.batch_size = 0  # out of range: the checks would refuse it
    else:
        cfg = RunnableConfig(data=cfg.data, loader=cfg.loader, augment=cfg.augment, optim=cfg.optim, run=cfg.run)
    message = refusal(lambda: train_module.train(cfg))
    assert message.startswith("train: the Config has not been through the entry checks, or was changed after them")
    assert not (tmp_path / "run").exists()


def test_the_refusal_survives_pickling_as_ray_and_multiprocessing_hand_it_on():
    error = pickle.loads(pickle.dumps(UncheckedConfig("train")))
    assert str(error) == str(UncheckedConfig("train")) and error.entry == "train"
