"""Config.with_values: the one place a setting is set by its flat name (train's and evaluate's flags and files)."""

import dataclasses

import pytest

from imagenet_train.commands.evaluate_cmd import SETTINGS
from imagenet_train.config import Config
from imagenet_train.main.entry_checks import RunnableConfig, runnable
from tests.conftest import refusal


@pytest.mark.unit
def test_each_flat_name_lands_in_the_section_that_declares_it():
    cfg = Config().with_values({"shards": "/data/shards.json", "batch_size": 64, "hflip": False, "lr": 0.2})
    assert (cfg.data.shards, cfg.loader.batch_size, cfg.augment.hflip, cfg.optim.lr) == (
        "/data/shards.json",
        64,
        False,
        0.2,
    )
    untouched = dataclasses.asdict(Config())
    assert dataclasses.asdict(cfg.run) == untouched["run"]


@pytest.mark.unit
def test_the_config_given_values_is_left_as_it_was():
    original = Config()
    changed = original.with_values({"epochs": 3, "arch": "resnet18"})
    assert (changed.run.epochs, changed.run.arch) == (3, "resnet18")
    assert dataclasses.asdict(original) == dataclasses.asdict(Config())


@pytest.mark.unit
def test_a_name_no_section_declares_is_refused_in_one_line():
    message = refusal(lambda: Config().with_values({"batch_size": 8, "bach_size": 8}))
    assert "'bach_size'" in message and "expected" in message


@pytest.mark.unit
def test_a_checked_config_given_new_values_is_a_plain_config_again():
    checked = runnable(Config().with_values({"shards": "/data/shards.json"}))
    changed = checked.with_values({"lr": 0.5})
    assert isinstance(checked, RunnableConfig) and not isinstance(changed, RunnableConfig)
    assert changed.data.shards == "/data/shards.json" and changed.optim.lr == 0.5


@pytest.mark.unit
def test_every_setting_evaluate_takes_is_one_a_section_declares():
    cfg = Config().with_values(dict.fromkeys(SETTINGS, "marker"))
    values = {k: v for section in dataclasses.asdict(cfg).values() for k, v in section.items()}
    assert {name for name, value in values.items() if value == "marker"} == set(SETTINGS)
