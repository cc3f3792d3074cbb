"""Every recipe in recipes/: loads through `train --config`, validates as the chart's `train:` values, passes the
planner at the world size it states, and names its anchor, the anchor's figure (as the anchor's, not ours), its
epochs, global batch, LR scaling and a GPU-hour estimate in its header."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from chartkit import CHART_DIR
from chartkit.values import coalesce, load_yaml, schema_errors
from imagenet_train.cli import build_parser
from imagenet_train.commands.train_cmd import train_config
from imagenet_train.config_checks import checked

from conftest import REPO

pytestmark = pytest.mark.unit

RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
HEADER_FIELDS = ("recipe", "anchor", "anchor_top1", "epochs", "world", "global_batch", "gpu_hours_h100")
IMAGENET_SHARDS = ["--nshards", "1282", "--samples-per-shard", "1000"]  # 1,282,000 samples, ImageNet's size


def header(path: Path) -> dict[str, str]:
    """The recipe's `# field: text` header lines (continuation lines start with '#   ')."""
    fields: dict[str, str] = {}
    last = ""
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if match := re.match(r"# (\w+): (.*)", line):
            last = match.group(1)
            fields[last] = match.group(2)
        elif line.startswith("#   ") and last:
            fields[last] += " " + line[4:]
    return fields


def world(path: Path) -> tuple[int, int]:
    """(nodes, processes per node) from the header's `world: N node(s) x G ...`."""
    match = re.match(r"(\d+) nodes? x (\d+)", header(path)["world"])
    assert match, f"{path.name}: world: expected 'N node(s) x G GPUs', got {header(path)['world']!r}"
    return int(match.group(1)), int(match.group(2))


def test_the_recipes_the_issue_asks_for_are_there():
    names = {path.name for path in RECIPES}
    assert {"small-images.yaml", "rn50-dle-90.yaml", "rn50-torchvision-v2.yaml", "rn50-lars-mlperf.yaml"} <= names
    assert {"rn50-ffcv-16.yaml", "rn50-ffcv-32.yaml", "rn50-ffcv-88.yaml", "rn18-ffcv-16.yaml"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_the_header_names_the_anchor_its_figure_as_the_anchors_and_the_run_it_describes(path):
    fields, settings = header(path), yaml.safe_load(path.read_text())
    missing = [name for name in HEADER_FIELDS if name not in fields]
    assert not missing, f"{path.name}: header lacks {missing}"
    if not fields["anchor"].startswith("none"):
        assert "not measured here" in fields["anchor_top1"], "an anchor's figure must say it is not ours"
        assert re.match(r"\d+(\.\d+)?", fields["anchor_top1"])
    assert int(fields["epochs"]) == settings["epochs"]
    assert int(re.match(r"\d+", fields["global_batch"]).group()) == settings["global_batch_size"]
    assert "per 256" in fields["global_batch"] and "scaled linearly" in fields["global_batch"]
    nodes, per_node = world(path)
    assert settings["global_batch_size"] % (nodes * per_node) == 0


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_the_recipe_loads_through_train_config_and_passes_its_checks(path):
    cfg = checked(train_config(["--config", str(path), "--train-urls", "x-{0..9}.tar", "--train-samples", "10"]))
    nodes, per_node = world(path)
    assert cfg.for_world(nodes * per_node).loader.batch_size * nodes * per_node == cfg.loader.global_batch_size


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_the_recipe_is_valid_as_the_charts_train_values(path):
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values = coalesce(load_yaml(CHART_DIR / "values.yaml"), {"train": yaml.safe_load(path.read_text())})
    assert schema_errors(values, schema) == []


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_the_planner_passes_the_recipe_at_its_world_size(path, capsys):
    nodes, per_node = world(path)
    argv = ["plan", "--config", str(path), "--nodes", str(nodes), "--gpus-per-node", str(per_node), *IMAGENET_SHARDS]
    args = build_parser().parse_args(argv)
    args.check(args)
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "verdict: OK" in out and "advice:" not in out, out[-600:]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_the_recipe_states_the_size_it_evaluates_at(path):
    # Spelled out rather than left to a default (224, torchvision's), so no change of default moves a recipe.
    settings = yaml.safe_load(path.read_text())
    assert settings["val_crop_size"] > 0 and settings["val_resize_size"] >= settings["val_crop_size"]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_the_recipe_reads_every_image_once_per_epoch_and_its_header_says_how(path):
    # Resampled mode draws shards with replacement (about 1/e of them unread in an epoch); every anchor reads each
    # image once per epoch. tests/integration/test_recipe_sampling.py shows it over 2 ranks with --log-keys.
    fields, settings = header(path), yaml.safe_load(path.read_text())
    assert fields["sampling"].startswith(f"{settings['mode']} mode")
    assert settings.get("mode") in ("split", "queue"), f"{path.name}: mode {settings.get('mode')!r}"
    assert fields["sampling"].startswith(f"{settings['mode']} mode: every ")
    if not fields["anchor"].startswith("none"):  # what is left of the anchor's sampling, start and init
        assert all(word in fields["differences"] for word in ("order:", "Join", "init:"))
