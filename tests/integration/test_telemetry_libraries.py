"""Each switch in launchers/telemetry.py is the one its library reads: in a clean environment the library
reports usage, with the switches it does not. In `make launchers` (importing Ray, MLflow and W&B twice takes
a minute on a loaded machine); tests/unit/test_telemetry_switches.py checks the image and `launch` quickly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from imagenet_train.launchers.telemetry import TELEMETRY_OFF

pytestmark = [pytest.mark.launchers, pytest.mark.timeout(900)]

# What each library consults before it reports: true when it would report.
PROBE = """
import json
from ray._common.usage import usage_lib
from mlflow.telemetry.utils import is_telemetry_disabled
from wandb import env
from huggingface_hub import constants
print(json.dumps({
    "ray": usage_lib._usage_stats_enabledness() != usage_lib.UsageStatsEnabledness.DISABLED_EXPLICITLY,
    "mlflow": not is_telemetry_disabled(),
    "wandb": env.error_reporting_enabled(),
    "huggingface_hub": not constants.HF_HUB_DISABLE_TELEMETRY,
}))
"""


def reports(extra: dict[str, str]) -> dict[str, bool]:
    """Which libraries would report, in a child Python with only PATH, HOME, PYTHONPATH and `extra`."""
    # Nothing else of this session's environment: CI markers and pytest's own variables turn some reporting off.
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **extra}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_switches_turn_off_what_each_library_would_report():
    libraries = {"ray", "mlflow", "wandb", "huggingface_hub"}
    assert reports({}) == dict.fromkeys(libraries, True)  # the check can fail: by default each one reports
    assert reports(TELEMETRY_OFF) == dict.fromkeys(libraries, False)
