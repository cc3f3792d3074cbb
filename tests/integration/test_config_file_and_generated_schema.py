"""One declaration per setting: `train --config FILE`, the generated chart schema and settings page, and
settings passed as flags where no file can be mounted (NGC)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import jsonschema
import pytest
import yaml

from imagenet_train.cli import build_parser
from imagenet_train.commands.train_cmd import _config_from
from imagenet_train.config import SECTIONS, Config, defaults
from imagenet_train.declarations import canonical_names
from imagenet_train.deployment import OWNED, settings_flags

from conftest import REPO as ROOT


def config_of(*argv: str) -> Config:
    return _config_from(build_parser().parse_args(["train", *argv]))


@pytest.mark.unit
def test_a_config_file_sets_what_it_names_and_flags_given_override_it(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("shards: /data/shards.json\nbatch_size: 64\nlr: 0.2\nhflip: false\nmode: split\n")
    cfg = config_of("--config", str(path), "--lr", "0.3")
    assert (cfg.data.shards, cfg.loader.batch_size, cfg.augment.hflip, cfg.loader.mode) == (
        "/data/shards.json",
        64,
        False,
        "split",
    )
    assert cfg.optim.lr == 0.3  # the flag wins over the file
    assert cfg.run.epochs == defaults()["epochs"]  # neither names it: the declaration's default


@pytest.mark.unit
def test_a_runs_config_json_loads_back_to_the_same_settings(tmp_path):
    original = config_of("--shards", "/data/shards.json", "--batch-size", "48", "--no-hflip", "--seed", "7")
    resolved = json.loads(original.to_json())
    resolved["derived"] = {"world_size": 2, "global_batch": 96}  # what the trainer adds; not a setting
    path = tmp_path / "config.json"
    path.write_text(json.dumps(resolved))
    assert config_of("--config", str(path)) == original


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("batch_size: many\n", "--config CFG: batch_size (--batch-size): expected a whole number >= 1"),
        ("batchsize: 64\n", "--config CFG: unknown setting 'batchsize'"),
        ("mode: exact\n", "--config CFG: mode (--mode): expected one of resampled, split, queue, got 'exact'"),
        ("hflip: 1\n", "--config CFG: hflip (--hflip): expected true or false"),
        ("- 1\n- 2\n", "--config CFG: expected a mapping, got list"),
        ("lr: [0.1\n", "--config CFG: not valid YAML or JSON at line"),
    ],
)
def test_bad_config_files_are_one_line_errors_naming_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "imagenet_train.cli", "train", "--config", str(path)], capture_output=True, text=True
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert message.replace("CFG", str(path)) in result.stderr


@pytest.mark.unit
def test_global_batch_size_derives_each_ranks_batch_or_names_the_world_it_does_not_divide():
    cfg = config_of("--shards", "x", "--global-batch-size", "96")
    assert cfg.for_world(3).loader.batch_size == 32 and cfg.for_world(1).loader.batch_size == 96
    with pytest.raises(Exception, match="--global-batch-size: 96 does not divide over 5 ranks"):
        cfg.for_world(5)
    assert config_of("--shards", "x").for_world(5).loader.batch_size == 256


def test_the_chart_schema_and_the_docs_settings_table_are_generated_from_the_declarations():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    train = json.loads((ROOT / "helm" / "imagenet-train" / "values.schema.json").read_text())["properties"]["train"]
    older_names = set(canonical_names(SECTIONS))  # image_size, val_resize: existing values files keep working
    assert set(train["properties"]) == (set(defaults()) | older_names) - OWNED
    assert train["properties"]["batch_size"] == {
        "description": "batch size per rank",
        "type": "integer",
        "default": 256,
        "minimum": 1,
        "maximum": 1 << 20,
    }
    jsonschema.validate({"lr": 0.2, "mode": "split", "hflip": False}, train)
    for bad in ({"lr": 0}, {"mode": "exact"}, {"batch_size": 1.5}, {"shards": "x"}, {"bogus": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, train)


@pytest.mark.unit
def test_a_stale_schema_is_reported(tmp_path, monkeypatch):
    from chartkit import schema

    copy = tmp_path / "values.schema.json"
    stale = json.loads(schema.SCHEMA.read_text())
    del stale["properties"]["train"]["properties"]["lr"]
    copy.write_text(json.dumps(stale))
    monkeypatch.setattr(schema, "SCHEMA", copy)
    assert schema.chart_schema_text() != copy.read_text()


@pytest.mark.unit
def test_a_stale_settings_page_is_reported_and_regenerated_with_every_setting(tmp_path, monkeypatch):
    from chartkit import schema

    page = tmp_path / "settings.md"
    current = schema.SETTINGS_PAGE.read_text()
    page.write_text("\n".join(line for line in current.splitlines() if "`--lr`" not in line) + "\n")
    monkeypatch.setattr(schema, "SETTINGS_PAGE", page)
    regenerated = schema.settings_page_text()
    assert regenerated != page.read_text() and regenerated == current
    assert all(f"`{name}`" in regenerated for name in defaults())


@pytest.mark.unit
def test_settings_as_flags_parse_back_to_the_same_config():
    chosen = {"lr": 0.25, "hflip": False, "channels_last": True, "mode": "queue", "epochs": 3, "arch": "resnet18"}
    cfg = config_of("--shards", "x", *settings_flags(chosen))
    expected = config_of("--shards", "x").with_values(chosen)
    assert dataclasses.asdict(cfg) == dataclasses.asdict(expected)


@pytest.mark.unit
def test_the_charts_default_train_values_are_a_valid_config_file(tmp_path):
    values = yaml.safe_load((ROOT / "helm" / "imagenet-train" / "values.yaml").read_text())
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(values["train"]))
    assert config_of("--config", str(path), "--shards", "x").run.resume == "latest"
