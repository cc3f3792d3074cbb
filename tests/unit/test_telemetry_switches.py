"""Library usage reporting is off by default: the image's ENV and `launch`'s environment for torchrun carry
every switch of launchers/telemetry.py, and a value the operator set wins."""

from __future__ import annotations

import os
import re

import pytest

from imagenet_train.launchers import launch
from imagenet_train.launchers.telemetry import TELEMETRY_OFF, telemetry_defaults

from conftest import REPO

pytestmark = pytest.mark.unit


def dockerfile_env(text: str) -> dict[str, str]:
    """Every NAME=VALUE of the Dockerfile's ENV instructions (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    pairs = [line.split()[1:] for line in joined.splitlines() if line.startswith("ENV ")]
    return dict(pair.split("=", 1) for words in pairs for pair in words)


def test_the_image_sets_every_telemetry_switch_the_launchers_set():
    env = dockerfile_env((REPO / "images" / "train" / "Dockerfile").read_text())
    assert {name: env.get(name) for name in TELEMETRY_OFF} == TELEMETRY_OFF
    assert {"RAY_USAGE_STATS_ENABLED", "MLFLOW_DISABLE_TELEMETRY", "WANDB_ERROR_REPORTING"} <= set(TELEMETRY_OFF)
    assert "HF_HUB_DISABLE_TELEMETRY" in TELEMETRY_OFF


def test_a_switch_the_operator_set_is_left_as_it_is():
    chosen = telemetry_defaults({"RAY_USAGE_STATS_ENABLED": "1", "DO_NOT_TRACK": "0", "PATH": "/bin"})
    assert "RAY_USAGE_STATS_ENABLED" not in chosen and "DO_NOT_TRACK" not in chosen
    assert chosen == {k: v for k, v in TELEMETRY_OFF.items() if k not in ("RAY_USAGE_STATS_ENABLED", "DO_NOT_TRACK")}


def test_launch_hands_torchrun_the_switches_unless_the_operator_set_one(monkeypatch):
    import torch.distributed.run

    environment = {k: v for k, v in os.environ.items() if k not in TELEMETRY_OFF}
    environment["MLFLOW_DISABLE_TELEMETRY"] = "false"  # the operator wants MLflow's
    monkeypatch.setattr(os, "environ", environment)
    seen: dict[str, str] = {}
    monkeypatch.setattr(torch.distributed.run, "main", lambda argv: seen.update(os.environ))
    assert launch.run(["train", "--help"], nproc="1") == 0
    assert {name: seen[name] for name in TELEMETRY_OFF} == {**TELEMETRY_OFF, "MLFLOW_DISABLE_TELEMETRY": "false"}
