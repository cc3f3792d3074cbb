"""What --tracker sends and which tracker run a resume continues, without a tracker (the real ones:
tests/integration/test_trackers.py)."""

from __future__ import annotations

import json

import pytest

from imagenet_train.config import Config
from imagenet_train.rundir.trackers import TRACKER_FILE, epoch_metrics, flat_params, param_text, saved_run_id

pytestmark = pytest.mark.unit


def test_params_are_config_json_flattened_by_section():
    resolved = {**json.loads(Config().to_json()), "derived": {"world_size": 2, "base_lr": 0.2}}
    params = flat_params(resolved)
    assert params["loader.batch_size"] == Config().loader.batch_size
    assert params["derived.world_size"] == 2
    assert params["run.tracker"] == "none"
    assert len(params) == sum(len(section) for section in resolved.values())
    assert (param_text(True), param_text(0.2), param_text("resnet50")) == ("true", "0.2", "resnet50")


def test_epoch_metrics_are_the_records_numbers_only():
    record = {
        "epoch": 3,
        "train_loss": 1.5,
        "top1": 0.5,
        "train_samples": 128,
        "batches_per_rank": [2, 2],  # per rank: stays in metrics.jsonl
        "replicas_in_sync": True,
        "final_weights": "raw",
        "val_loss": float("nan"),
    }
    assert epoch_metrics(record) == {"epoch": 3.0, "train_loss": 1.5, "top1": 0.5, "train_samples": 128.0}


def test_resume_continues_the_saved_tracker_run_of_the_same_tracker_only(tmp_path):
    (tmp_path / TRACKER_FILE).write_text(json.dumps({"tracker": "mlflow", "run_id": "0a1b2c"}))
    assert saved_run_id(tmp_path, "mlflow", resume=True) == "0a1b2c"
    assert saved_run_id(tmp_path, "mlflow", resume=False) is None  # a new run in the same directory
    assert saved_run_id(tmp_path, "wandb", resume=True) is None
    assert saved_run_id(tmp_path / "elsewhere", "mlflow", resume=True) is None


@pytest.mark.parametrize(
    "content",
    [
        '{"tracker": "mlflow", "run_id": "../../etc"}',
        '{"tracker": "mlflow", "run_id": 7}',
        '{"tracker": "mlflow"}',
        "[1, 2]",
        "not json",
        '{"tracker": "mlflow", "run_id": "' + "a" * 10_000 + '"}',
    ],
)
def test_a_tracker_file_that_is_not_ours_starts_a_new_tracker_run(tmp_path, content, caplog):
    (tmp_path / TRACKER_FILE).write_text(content)
    assert saved_run_id(tmp_path, "mlflow", resume=True) is None
    assert "not a tracker record of ours" in caplog.text
