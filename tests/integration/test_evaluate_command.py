"""`imagenet-train evaluate`: the same top-1 as the end of training on the same weights (raw, EMA and
final.pt), every val sample once over two ranks, per-class counts, and one-line errors for bad files."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from imagenet_train import cli as cli_module
from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.rundir import checkpoint

from conftest import cli, read_metrics, torchrun, write_image_folder

# 3 classes: 12 training and 5 val images each, 4 samples to a shard
TINY = ["--arch", "resnet18", "--image-size", "32", "--val-resize", "32", "--val-crop-size", "32"]
TINY += ["--batch-size", "8", "--workers", "1"]
TRAIN = [*TINY, "--epochs", "1", "--epoch-batches", "3", "--no-tensorboard", "--shuffle-buffer", "20"]
RECIPE = ["--model-ema", "--model-ema-steps", "1", "--warmup-epochs", "0", "--val-tta", "--mixup-alpha", "0.2"]


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    write_image_folder(root / "in", {"n01": 12, "n02": 12, "n03": 12}, {"n01": 5, "n02": 5, "n03": 5})
    convert(str(root / "in"), str(root / "shards"), ShardOptions(maxcount=4), progress=False)
    return root / "shards"


def _evaluate(*args: str, nproc: int = 1) -> dict:
    """Run `evaluate ... --out -` (under torchrun for nproc > 1); its JSON report."""
    if nproc == 1:
        result = cli("evaluate", *args, "--out", "-", timeout=240)
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        command += ["-m", "imagenet_train.cli", "evaluate", *args, "--out", "-"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "evaluate: " in result.stderr and " top1 " in result.stderr  # the summary line
    return json.loads(result.stdout)


def test_evaluate_gives_the_same_top1_as_the_end_of_training(tiny_shards, tmp_path):
    run_dir = tmp_path / "run"
    trained = cli("train", "--shards", str(tiny_shards), "--run-dir", str(run_dir), *TRAIN, *RECIPE, timeout=400)
    assert trained.returncode == 0, trained.stderr[-3000:]
    last = read_metrics(run_dir)[-1]
    assert {"top1", "ema_top1", "ema_top3", "ema_val_loss"} <= last.keys()
    assert f"final weights: {last['final_weights'].replace('ema', 'EMA')} (" in trained.stdout
    config = ["--config", str(run_dir / "config.json")]  # the run's own data settings (and --val-tta)
    saved = str(run_dir / "checkpoints" / "epoch-0000.pt")

    raw = _evaluate(saved, *config)
    # the same numbers, not merely close: the loss too, which any change to the logits (the flip) would move
    assert (raw["top1"], raw["top3"], raw["val_loss"]) == (last["top1"], last["top3"], last["val_loss"])
    assert raw["val_tta"] is True
    assert raw["val_samples"] == 15 and [c["samples"] for c in raw["per_class"]] == [5, 5, 5]
    hits = sum(round(c["top1"] * c["samples"]) for c in raw["per_class"])
    assert hits / 15 == raw["top1"]

    averaged = _evaluate(saved, *config, "--ema")
    assert (averaged["top1"], averaged["val_loss"]) == (last["ema_top1"], last["ema_val_loss"])
    final = _evaluate(str(run_dir / "final.pt"), *config)
    chosen = "ema_" if last["final_weights"] == "ema" else ""
    assert (final["top1"], final["val_loss"]) == (last[chosen + "top1"], last[chosen + "val_loss"])


def test_evaluate_on_two_ranks_counts_every_val_sample_once(tiny_shards, tmp_path):
    """Trained on two ranks with AMP, MixUp/CutMix, EMA and BlurPool; evaluated on two ranks: the training's top-1."""
    run_dir = tmp_path / "run"
    mixing = ["--cutmix-alpha", "1.0", "--amp", "bf16", "--blurpool"]  # BlurPool: evaluate builds the same network
    trained = torchrun(["--shards", str(tiny_shards), "--run-dir", str(run_dir), *TRAIN, *RECIPE, *mixing])
    assert trained.returncode == 0, trained.stderr[-3000:]
    last = read_metrics(run_dir)[-1]
    assert last["replicas_in_sync"] is True and "ema_top1" in last
    report = _evaluate(
        str(run_dir / "checkpoints" / "epoch-0000.pt"), "--config", str(run_dir / "config.json"), nproc=2
    )
    assert report["val_samples"] == 15 == last["val_samples"]  # each of the 15 once: neither lost nor doubled
    assert [c["samples"] for c in report["per_class"]] == [5, 5, 5]
    assert (report["top1"], report["val_loss"]) == (last["top1"], last["val_loss"])


def _error(capsys, *args: str, shards: str = "unused.json") -> str:
    assert cli_module.main(["evaluate", *args, "--shards", shards]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("imagenet-train: error: ")
    return lines[0]


def test_evaluate_errors_are_one_line(tiny_shards, tmp_path, capsys):
    assert "no such weights file" in _error(capsys, str(tmp_path / "missing.pt"))

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    saved = checkpoint.RunState(tmp_path, {"model": model, "optimizer": optimizer, "scaler": scaler}, {}).write(0)
    line = _error(capsys, str(saved), "--ema")
    assert "--ema: " in line and "holds no EMA weights" in line

    assert "weights do not fit --arch resnet50 with 3 classes" in _error(capsys, str(saved), shards=str(tiny_shards))

    objects = tmp_path / "objects.pt"
    torch.save({"model": model}, objects)  # a pickled module: loading it could run code
    assert "holds Python objects" in _error(capsys, str(objects))
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"weight": [1.0, 2.0]}))
    assert "plain.pkl: unreadable weights file" in _error(capsys, str(plain))


def test_evaluate_rebuilds_a_narrow_small_stem_network_from_the_runs_config(tiny_shards, tmp_path):
    # The small-images recipe's network: a run's config.json must rebuild it, or its weights do not fit.
    run_dir, network = tmp_path / "run", ["--arch", "timm/resnet18", "--resnet-width", "16", "--stem", "small"]
    trained = cli("train", "--shards", str(tiny_shards), "--run-dir", str(run_dir), *TRAIN, *network, timeout=400)
    assert trained.returncode == 0, trained.stderr[-3000:]
    report = _evaluate(str(run_dir / "final.pt"), "--config", str(run_dir / "config.json"))
    assert report["arch"] == "timm/resnet18" and report["top1"] == read_metrics(run_dir)[-1]["top1"]


def test_the_report_goes_beside_the_weights_never_into_the_run_dir_a_config_names(tiny_shards, tmp_path):
    from imagenet_train.config import Config
    from imagenet_train.training.models import architecture

    cfg = Config()
    cfg.run.arch = "resnet18"
    weights = tmp_path / "downloaded" / "weights.pt"
    weights.parent.mkdir()
    torch.save(architecture(cfg.run, 3).state_dict(), weights)
    their_run = tmp_path / "their-run"  # the folder of the run whose config.json is reused
    their_run.mkdir()
    config = tmp_path / "their-config.json"
    config.write_text(json.dumps({"run_dir": str(their_run), "shards": str(tiny_shards), "arch": "resnet18"}))
    result = cli("evaluate", str(weights), "--config", str(config), *TINY, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"written to {weights.parent / 'eval.json'}" in result.stdout
    assert json.loads((weights.parent / "eval.json").read_text())["val_samples"] == 15
    assert list(their_run.iterdir()) == []
