"""config.json's sections: the data settings split by concern (data, loader, augment) with the flags and flat keys
unchanged, and a run's config.json written before the split still read back by `train --config` (a resumed or
repeated run) and `evaluate --config`."""

import dataclasses
import json

import pytest

from imagenet_train.cli import build_parser
from imagenet_train.commands import evaluate_cmd
from imagenet_train.commands.train_cmd import train_config
from imagenet_train.config import SECTIONS, Config
from imagenet_train.declarations import declared

pytestmark = pytest.mark.unit

# Where each setting sat in config.json before the split: the optimizer's section held MixUp and CutMix, and the
# data section every setting of today's loader and augment sections.
MOVED_FROM_OPTIM = ("mixup_alpha", "cutmix_alpha")


def a_run_config() -> Config:
    """A run's Config with a setting changed in each of today's sections."""
    cfg = Config()
    cfg.data.shards, cfg.data.num_classes = "/data/shards.json", 10
    cfg.loader.batch_size, cfg.loader.workers, cfg.loader.decoder, cfg.loader.io_timeout = 48, 3, "pil", 30.0
    cfg.augment.train_crop_size, cfg.augment.val_crop_size, cfg.augment.val_resize_size = 32, 32, 36
    cfg.augment.mixup_alpha, cfg.augment.hflip = 0.2, False
    cfg.optim.lr, cfg.run.epochs = 0.5, 7
    return cfg


def old_layout(cfg: Config) -> dict:
    """`cfg` as a run wrote config.json before the split: sections data, optim and run, and the derived values."""
    today = json.loads(cfg.to_json())
    optim = {**today["optim"], **{name: today["augment"][name] for name in MOVED_FROM_OPTIM}}
    augment = {k: v for k, v in today["augment"].items() if k not in MOVED_FROM_OPTIM}
    data = {**today["data"], **today["loader"], **augment}
    return {"data": data, "optim": optim, "run": today["run"], "derived": {"world_size": 1, "base_lr": 0.1}}


def test_every_setting_sits_in_exactly_one_section_under_its_unchanged_flat_name():
    names = [d.name for section in SECTIONS for d, _ in declared(section)]
    assert len(names) == len(set(names))
    assert {"shards", "batch_size", "train_crop_size", "mixup_alpha", "label_smoothing"} <= set(names)
    assert list(json.loads(Config().to_json())) == ["data", "loader", "augment", "optim", "run"]


def test_a_run_config_json_written_before_the_data_section_was_split_repeats_the_run(tmp_path):
    written = a_run_config()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old_layout(written)))
    assert set(json.loads(path.read_text())) == {"data", "optim", "run", "derived"}
    assert dataclasses.asdict(train_config(["--config", str(path)])) == dataclasses.asdict(written)


def test_flags_still_override_an_old_layout_config_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old_layout(a_run_config())))
    cfg = train_config(["--config", str(path), "--batch-size", "16", "--cutmix-alpha", "1.0", "--resume", "latest"])
    assert (cfg.loader.batch_size, cfg.augment.cutmix_alpha, cfg.augment.mixup_alpha) == (16, 1.0, 0.2)
    assert (cfg.run.resume, cfg.run.epochs, cfg.loader.decoder) == ("latest", 7, "pil")


def test_evaluate_reads_the_val_settings_of_an_old_layout_config_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old_layout(a_run_config())))
    args = build_parser().parse_args(["evaluate", str(tmp_path / "final.pt"), "--config", str(path)])
    cfg = evaluate_cmd._config_from(args)
    assert (cfg.data.shards, cfg.data.num_classes) == ("/data/shards.json", 10)
    assert (cfg.augment.eval_crop_size(), cfg.augment.val_resize_size, cfg.loader.batch_size) == (32, 36, 48)


def test_todays_config_json_reads_back_section_by_section(tmp_path):
    written = a_run_config()
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(written.to_json()), "derived": {"world_size": 1}}))
    assert dataclasses.asdict(train_config(["--config", str(path)])) == dataclasses.asdict(written)
