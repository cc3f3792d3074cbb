"""A settings file is data: a results folder's config.json, a `--config` YAML or a recipe never runs a command
or widens trust. What does (`pipe:` sources, --trust-index, --no-verify-shards: each declaration's `trust`)
comes only from the command line; from a file it is one line naming the file and the key, exit 2. A value a
record redacted is refused the same way, never used.

An attack that ran would leave the `marker` file; each test checks that it never appears.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from imagenet_train.config import Config
from imagenet_train.config_files import check_data, load_settings
from imagenet_train.declarations import Trust, declared
from imagenet_train.deployment import read_deployment
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.redact import MARK
from imagenet_train.training.models import architecture

from .test_index_attacks import TINY_TRAIN, two_sample_shard
from conftest import REPO, cli, write_index

CHART = REPO / "helm" / "imagenet-train"


def one_line_refusal(result, *expected: str) -> str:
    """The single error line of a refused command (exit 2), which holds each of `expected`."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("imagenet-train: error: "), result.stderr[-3000:]
    assert all(text in lines[0] for text in expected), lines[0]
    return lines[0]


def downloaded_run(folder: Path, **data: object) -> Path:
    """A results folder from elsewhere: final.pt (real resnet18 weights for 2 classes) and the config.json a run
    writes, with `data` settings of the attacker's choosing; the folder."""
    folder.mkdir()
    cfg = Config()
    cfg.run.arch, cfg.data.num_classes, cfg.loader.workers = "resnet18", 2, 0
    torch.save(architecture(cfg.run, 2).state_dict(), folder / "final.pt")
    cfg.augment.train_crop_size = cfg.augment.val_crop_size = cfg.augment.val_resize_size = 32
    cfg.run.run_dir = str(folder)
    for name, value in data.items():
        setattr(cfg.data, name, value)
    (folder / "config.json").write_text(cfg.to_json())
    return folder


def test_evaluate_with_a_downloaded_runs_config_never_runs_its_pipe_val_urls(tmp_path, marker):
    shard = tmp_path / "val-000000.tar"
    two_sample_shard(shard)
    run = downloaded_run(
        tmp_path / "downloaded",
        train_urls=str(shard),
        val_urls=f"pipe:touch {marker}; cat {shard}",
    )
    # The README's own line.
    result = cli("evaluate", str(run / "final.pt"), "--config", str(run / "config.json"), timeout=240)
    assert not marker.exists()
    one_line_refusal(result, f"--config {run / 'config.json'}", "val_urls", "pipe:", "--val-urls", "command line")


def test_train_with_trust_index_from_a_config_file_runs_nothing_the_index_names(tmp_path, marker):
    shard = tmp_path / "real.tar"
    two_sample_shard(shard)
    index = write_index(tmp_path, [{"url": f"pipe:touch {marker}; cat {shard}", "nsamples": 2}])
    config = tmp_path / "downloaded.yaml"
    config.write_text(yaml.safe_dump({"shards": str(index), "trust_index": True}))
    result = cli("train", "--config", str(config), "--run-dir", str(tmp_path / "run"), *TINY_TRAIN, timeout=240)
    assert not marker.exists()
    one_line_refusal(result, f"--config {config}", "trust_index", "--trust-index", "command line")


@pytest.mark.parametrize(
    "spec",
    ["pipe:touch {marker}", "PIPE:touch {marker}", "{{pipe:touch {marker},x.tar}}", "a.tar::Pipe:touch {marker}"],
    ids=["plain", "upper-case (a scheme is case-insensitive: refused too)", "inside braces", "in a :: list"],
)
def test_a_recipe_naming_a_pipe_command_in_any_form_is_refused_before_anything_runs(tmp_path, marker, spec):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"train_urls": spec.format(marker=marker), "num_classes": 2, "train_samples": 2}))
    result = cli("train", "--config", str(recipe), "--run-dir", str(tmp_path / "run"), *TINY_TRAIN, timeout=240)
    assert not marker.exists()
    one_line_refusal(result, f"--config {recipe}", "train_urls", "--train-urls")


def test_plan_refuses_trust_index_from_its_config_but_takes_the_flag_given(tmp_path):
    index = write_index(tmp_path, [{"url": "/elsewhere/shard.tar", "nsamples": 2}])  # outside its folder
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"shards": str(index), "trust_index": True, "batch_size": 2, "workers": 1}))
    one_line_refusal(cli("plan", "--config", str(config)), f"--config {config}", "trust_index")
    given = cli("plan", "--config", str(config), "--trust-index")  # the operator's own flag: used as given
    assert given.returncode == 0, given.stdout + given.stderr[-3000:]
    assert "plan: 1 shards, 2 samples" in given.stdout and "--trust-index" in given.stderr  # and its warning


def test_a_records_redacted_url_is_refused_not_used(tmp_path):
    run = downloaded_run(
        tmp_path / "run", train_urls="/data/train.tar", val_urls="https://user:pw@h.example/val.tar?sig=abc"
    )
    assert (
        json.loads((run / "config.json").read_text())["data"]["val_urls"]
        == f"https://{MARK}@h.example/val.tar?sig={MARK}"
    )
    result = cli("evaluate", str(run / "final.pt"), "--config", str(run / "config.json"))
    one_line_refusal(result, f"--config {run / 'config.json'}", "val_urls", "redacted", "--val-urls")


# The same rule, for every setting that has one and every file that is read: checked against the declarations.
WIDENING = {Trust.WHEN_ON: True, Trust.WHEN_OFF: False, Trust.PIPE: "pipe:true"}


@pytest.mark.unit
@pytest.mark.parametrize(
    "name,trust",
    [(d.name, rule.trust) for section in Config().sections() for d, rule in declared(section) if rule.trust],
)
def test_every_setting_marked_command_line_only_is_refused_from_a_file_and_taken_from_a_flag(tmp_path, name, trust):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({name: WIDENING[trust]}))
    with pytest.raises(ImagenetTrainError, match=f"^--config {path}: {name}: .*command line"):
        load_settings(path)
    assert load_settings(path, given={name}) == {name: WIDENING[trust]}  # the flag given wins; unused here
    check_data({name: not WIDENING[trust] if isinstance(WIDENING[trust], bool) else "http://h/x.tar"}, "file")


@pytest.mark.unit
def test_the_marked_settings_are_the_ones_that_run_commands_or_widen_trust():
    marked = {d.name: rule.trust for section in Config().sections() for d, rule in declared(section) if rule.trust}
    assert marked == {
        "shards": Trust.PIPE,
        "trust_index": Trust.WHEN_ON,
        "train_urls": Trust.PIPE,
        "val_urls": Trust.PIPE,
        "verify_shards": Trust.WHEN_OFF,
    }


@pytest.mark.unit
def test_the_charts_command_line_only_train_values_reach_train_as_flags():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    document = {key: values[key] for key in ("launcher", "shards", "results", "cache", "gcp", "resources")}
    document |= {"name": "r-imagenet-train", "release": "r"}
    document["train"] = {"trust_index": True, "verify_shards": False, "lr": 0.2}  # the operator's values
    assert read_deployment(document).train_flags[-2:] == ["--trust-index", "--no-verify-shards"]
    document["train"] = {"trust_index": False, "verify_shards": True}
    shards = "http://r-imagenet-train-shards/shards.json"
    assert read_deployment(document).train_flags == ["--shards", shards, "--run-dir", "/results/r"]
