"""Usage reporting to library vendors, off unless the operator turns it on: one table of the switches each reads.

A training job's processes talk to the places its operator named (shards, a results bucket, a tracker), not
to Anyscale, Databricks, W&B's crash reporter or the Hugging Face Hub's usage counter. The image sets the same
table as ENV (images/train/Dockerfile; a test keeps the two equal); `launch` and `ray` set whatever the
environment does not already set, so a value the operator gives (RAY_USAGE_STATS_ENABLED=1) wins.
"""

from __future__ import annotations

from collections.abc import Mapping

# Each library's own switch, as it reads it (the library file that does, for the next version bump).
TELEMETRY_OFF: dict[str, str] = {
    "RAY_USAGE_STATS_ENABLED": "0",  # Ray's cluster usage stats (ray/_common/usage/usage_lib.py)
    "MLFLOW_DISABLE_TELEMETRY": "true",  # MLflow >= 3.2's usage events (mlflow/telemetry/utils.py)
    "WANDB_ERROR_REPORTING": "false",  # W&B's SDK crash reports, sent to W&B's Sentry (wandb/env.py)
    "HF_HUB_DISABLE_TELEMETRY": "1",  # the Hugging Face Hub's usage headers, e.g. timm's weights (constants.py)
    "DO_NOT_TRACK": "1",  # the shared convention (donottrack.sh): MLflow and the Hub read it too
}


def telemetry_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """The switches of TELEMETRY_OFF that `env` does not set: what to add so no library reports usage."""
    return {name: value for name, value in TELEMETRY_OFF.items() if name not in env}
