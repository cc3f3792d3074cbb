"""Separate train and eval sizes under torchvision's names, today's names as aliases, and the combinations
that are refused in one line."""

import json

import pytest

from imagenet_train.cli import build_parser
from imagenet_train.commands.train_cmd import _config_from
from imagenet_train.config import AugmentConfig, Config
from imagenet_train.config_checks import checked
from imagenet_train.config_files import load_settings
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.loading.dali import available as dali_available
from imagenet_train.loading.presets import ValPreset

pytestmark = pytest.mark.unit


def config_of(*flags: str) -> Config:
    return _config_from(build_parser().parse_args(["train", "--shards", "x", *flags]))


def val_resize(data: AugmentConfig) -> int:
    """The short side the evaluation preset resizes to before its centre crop."""
    preset = ValPreset(data.eval_crop_size(), data.val_resize_size or None)
    return preset.build().transform.transforms[0].size[0]


def test_defaults_train_at_224_and_evaluate_resize_256_crop_224():
    data = config_of().augment
    assert (data.train_crop_size, data.eval_crop_size(), val_resize(data)) == (224, 224, 256)


def test_torchvision_names_set_train_and_eval_sizes_apart():
    data = config_of("--train-crop-size", "176", "--val-resize-size", "232", "--val-crop-size", "224").augment
    assert (data.train_crop_size, data.eval_crop_size(), val_resize(data)) == (176, 224, 232)


def test_torchvisions_own_rn50_v2_command_evaluates_at_224_whatever_the_train_crop():
    # torchvision's command gives no --val-crop-size: its default, 224, holds whatever --train-crop-size says.
    data = config_of("--train-crop-size", "176", "--val-resize-size", "232").augment
    assert (data.train_crop_size, data.eval_crop_size(), val_resize(data)) == (176, 224, 232)
    assert json.loads(Config().to_json())["augment"]["val_crop_size"] == 224  # config.json holds the resolved size


def test_a_val_crop_of_0_follows_the_train_crop_as_config_files_before_the_default_meant():
    data = config_of("--train-crop-size", "160", "--val-crop-size", "0").augment
    assert (data.eval_crop_size(), val_resize(data)) == (160, 183)  # 160 / 0.875


def test_image_size_flag_still_sets_the_train_crop():
    data = config_of("--image-size", "160", "--val-resize", "256").augment
    assert (data.train_crop_size, data.eval_crop_size(), val_resize(data)) == (160, 224, 256)
    assert config_of("--image-size", "160").augment.val_resize_size == 0  # 224 / 0.875
    assert val_resize(config_of("--image-size", "160").augment) == 256


def test_a_config_file_with_the_old_names_still_loads(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("image_size: 160\nval_resize: 192\nval_crop_size: 0\n")
    assert load_settings(path) == {"train_crop_size": 160, "val_resize_size": 192, "val_crop_size": 0}
    data = config_of("--config", str(path)).augment
    assert (data.train_crop_size, data.eval_crop_size(), data.val_resize_size) == (160, 160, 192)
    assert config_of("--config", str(path), "--train-crop-size", "128").augment.train_crop_size == 128


def test_a_config_file_giving_both_names_of_one_setting_is_refused(tmp_path):
    path = tmp_path / "both.yaml"
    path.write_text("image_size: 160\ntrain_crop_size: 176\n")
    with pytest.raises(ImagenetTrainError, match="image_size and train_crop_size name the same setting"):
        load_settings(path)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--progressive-start-size", "160"], "--progressive-start-size/--progressive-end-size: give both"),
        (
            ["--progressive-start-size", "160", "--progressive-end-size", "192", "--progressive-start-epoch", "5"],
            "--progressive-end-epoch: 0 is before --progressive-start-epoch 5",
        ),
        (["--val-crop-size", "256", "--val-resize-size", "232"], "--val-resize-size: 232 is smaller than"),
        (["--auto-augment", "ta"], "--auto-augment: expected one of none, ta_wide, ra, imagenet"),
        (["--random-erase", "1.5"], "--random-erase: expected a number >= 0 and <= 1"),
    ],
)
def test_bad_combinations_are_refused_in_one_line(flags, message):
    with pytest.raises((ImagenetTrainError, SystemExit)) as raised:
        checked(config_of(*flags))
    if raised.type is ImagenetTrainError:
        assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.skipif(not dali_available(), reason="NVIDIA DALI not installed")
def test_random_erase_is_refused_with_the_dali_decoder():
    with pytest.raises(ImagenetTrainError, match="--random-erase: not available with --decoder dali"):
        checked(config_of("--random-erase", "0.25", "--decoder", "dali"))
