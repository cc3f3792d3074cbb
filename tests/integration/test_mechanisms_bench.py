"""bench/mechanisms.py (`make mechanisms`): every row's flags switch exactly its mechanism against the recipe, and
a tiny table goes the whole way (fashion-mnist → shards → nginx → torchrun) into the page."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from imagenet_train.commands.train_cmd import train_config
from imagenet_train.config import defaults
from imagenet_train.datasets.fashion_mnist import CLASSES, FILES
from imagenet_train.datasets.idx import write_idx

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import mechanisms  # noqa: E402

RECIPE = REPO / "recipes" / "small-images.yaml"


def _settings(flags: list[str]) -> dict:
    """The resolved settings `train --config RECIPE FLAGS` would run with (checked as train checks them)."""
    config = train_config(["--shards", "x", "--config", str(RECIPE), *flags])
    return {k: v for section in config.sections() for k, v in vars(section).items()}


@pytest.mark.parametrize(
    "name", [n for n in mechanisms.MECHANISMS if mechanisms.MECHANISMS[n].needs in ("", *defaults())]
)
def test_each_row_switches_its_mechanism_and_nothing_else(name):
    rows, missing = mechanisms.plan_rows(RECIPE, [name], nproc=2, epochs=8)
    assert not missing and len(rows) == 1
    recipe = _settings(["--epochs", "8"])
    switched = _settings(["--epochs", "8", *rows[0]["flags"]])
    mechanism = mechanisms.MECHANISMS[name]
    recipe["_nproc"] = switched["_nproc"] = 2
    if name != "sgd-8x":
        assert mechanism.is_on(switched) != mechanism.is_on(recipe)
    changed = {k for k in recipe if recipe[k] != switched[k]}
    assert changed and changed <= {
        *("model_ema", "label_smoothing", "mixup_alpha", "cutmix_alpha", "auto_augment", "random_erase", "val_tta"),
        *("progressive_start_size", "progressive_end_size", "progressive_start_epoch", "progressive_end_epoch"),
        "progressive_step",
        *("ra_reps", "opt", "global_batch_size"),
    }
    if name.endswith("-8x"):
        assert switched["global_batch_size"] == mechanisms.BATCH_FACTOR * recipe["global_batch_size"]


def test_a_row_this_revision_cannot_run_is_left_out_and_said(monkeypatch):
    monkeypatch.setitem(
        mechanisms.MECHANISMS, "ra", mechanisms.Mechanism("x", lambda r: False, list, list, needs="no_such_setting")
    )
    rows, missing = mechanisms.plan_rows(RECIPE, ["recipe", "ra"], nproc=2, epochs=2)
    assert [r["row"] for r in rows] == ["recipe"]
    assert missing == ["x (no --no-such-setting at this revision)"]


def test_a_tiny_table_trains_through_nginx_and_torchrun_into_the_page(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(len(CLASSES)), 6).astype(np.uint8)
    write_idx(tmp_path / f"{FILES['train'][0]}.gz", rng.integers(0, 256, (len(labels), 8, 8), dtype=np.uint8))
    write_idx(tmp_path / f"{FILES['train'][1]}.gz", labels)
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\n## Kept\n\nhand-written\n")
    command = [
        *(sys.executable, str(REPO / "bench" / "mechanisms.py"), "--source", str(tmp_path), "--epochs", "1"),
        *("--seeds", "0", "--train-size", "20", "--holdout", "20", "--rows", "recipe", "tta", "--out", str(page)),
        *("--workdir", str(tmp_path / "work"), "--extra=--global-batch-size 8 --workers 0"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    text = page.read_text()
    assert "## Kept\n\nhand-written" in text
    assert mechanisms.HEADING in text and "--rows recipe tta" in text
    assert "20 class-balanced train images, 20 held out" in text
    rows = [line for line in text.splitlines() if line.startswith("| the recipe") or line.startswith("| test-time")]
    assert len(rows) == 2
    assert "on: `--val-tta`" in rows[1]
    for row in rows:
        top1 = float(row.split("|")[3].split("±")[0])
        assert 0.0 <= top1 <= 1.0
