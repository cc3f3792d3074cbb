"""One declaration per setting: flags, checks and help come from the config dataclasses."""

import pytest

from imagenet_train.cli import build_parser
from imagenet_train.config import Config
from imagenet_train.config_checks import checked
from imagenet_train.declarations import declared, flag
from imagenet_train.errors import ImagenetTrainError

from conftest import REPO

pytestmark = pytest.mark.unit


def test_every_declared_setting_is_a_train_flag_with_its_help():
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    options = {option: action for action in train._actions for option in action.option_strings}
    for section in Config().sections():
        for declaration, rule in declared(section):
            assert flag(declaration.name) in options
            assert options[flag(declaration.name)].help.startswith(rule.help)


@pytest.mark.parametrize(
    ("section", "name", "value", "message"),
    [
        ("optim", "lr", -1.0, "--lr: expected a number > 0 and <= 1000, got '-1.0'"),
        ("run", "checkpoint_every", -3, "--checkpoint-every: expected a whole number >= 0, got '-3'"),
        ("loader", "mode", "sequential", "--mode: expected one of resampled, split, queue, got 'sequential'"),
        ("augment", "min_crop_scale", 0.0, "--min-crop-scale: expected a number > 0 and <= 1, got '0.0'"),
        ("loader", "io_timeout", float("nan"), "--io-timeout: expected a number >= 0"),
    ],
)
def test_values_set_in_code_get_the_same_one_line_check_as_flags(section, name, value, message):
    cfg = Config()
    cfg.data.shards = "shards.json"
    setattr(getattr(cfg, section), name, value)
    with pytest.raises(ImagenetTrainError) as caught:
        checked(cfg)
    assert str(caught.value).startswith(message)


def test_the_loader_may_not_give_up_before_the_io_budget():
    cfg = Config()
    cfg.data.shards, cfg.loader.io_timeout, cfg.loader.loader_timeout = "shards.json", 900, 600
    with pytest.raises(ImagenetTrainError, match="--loader-timeout: 600 s would give up before --io-timeout 900 s"):
        checked(cfg)
    cfg.loader.loader_timeout = 0  # wait forever is allowed
    checked(cfg)


def test_repeated_augmentation_is_a_flag_and_needs_a_mode_that_reads_shards_in_order():
    from imagenet_train.commands.train_cmd import train_config

    assert checked(train_config(["--shards", "x", "--mode", "queue", "--ra-reps", "4"])).loader.ra_reps == 4
    cfg = train_config(["--shards", "x", "--ra-reps", "4"])  # the default mode, resampled
    with pytest.raises(ImagenetTrainError, match=r"^--ra-reps 4: needs --mode split or queue") as caught:
        checked(cfg)
    assert "\n" not in str(caught.value)
    checked(train_config(["--shards", "x", "--ra-reps", "1"]))  # 1 (and 0, the default) is off
    schema = (REPO / "helm" / "imagenet-train" / "values.schema.json").read_text()
    settings = (REPO / "docs" / "settings.md").read_text()
    assert '"ra_reps"' in schema and "`--ra-reps` / `ra_reps`" in settings
