"""Which tracker settings send credentials over plain http (refused at start), and which do not."""

from __future__ import annotations

import pytest

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.rundir.tracker_replies import check_transport


@pytest.mark.parametrize(
    ("tracker", "env"),
    [
        ("mlflow", {"MLFLOW_TRACKING_URI": "http://mlflow.team:5000", "MLFLOW_TRACKING_TOKEN": "SECRET"}),
        ("mlflow", {"MLFLOW_TRACKING_URI": "HTTP://10.0.0.7/", "MLFLOW_TRACKING_PASSWORD": "SECRET"}),
        ("mlflow", {"MLFLOW_TRACKING_URI": "http://user:SECRET@mlflow.team/?token=SECRET"}),
        ("wandb", {"WANDB_BASE_URL": "http://wandb.team:8080", "WANDB_API_KEY": "SECRET"}),
    ],
)
def test_credentials_for_a_plain_http_tracker_are_refused_without_showing_them(tracker, env):
    with pytest.raises(ImagenetTrainError, match="https is required") as refused:
        check_transport(tracker, env)
    message = str(refused.value)
    assert "SECRET" not in message and "\n" not in message and f"--tracker {tracker}" in message
    assert "mlflow.team" in message or "10.0.0.7" in message or "wandb.team" in message


@pytest.mark.parametrize(
    ("tracker", "env"),
    [
        ("mlflow", {"MLFLOW_TRACKING_URI": "https://mlflow.team", "MLFLOW_TRACKING_TOKEN": "t"}),
        ("mlflow", {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "MLFLOW_TRACKING_TOKEN": "t"}),
        ("mlflow", {"MLFLOW_TRACKING_URI": "http://localhost:5000", "MLFLOW_TRACKING_USERNAME": "u"}),
        ("mlflow", {"MLFLOW_TRACKING_URI": "http://[::1]:5000", "MLFLOW_TRACKING_TOKEN": "t"}),
        ("mlflow", {"MLFLOW_TRACKING_URI": "http://mlflow.team:5000"}),
        ("mlflow", {"MLFLOW_TRACKING_URI": "file:///tmp/mlruns", "MLFLOW_TRACKING_TOKEN": "t"}),
        ("wandb", {"WANDB_API_KEY": "k"}),
        ("none", {"MLFLOW_TRACKING_URI": "http://mlflow.team", "MLFLOW_TRACKING_TOKEN": "t"}),
    ],
)
def test_https_loopback_and_credential_free_trackers_are_accepted(tracker, env):
    check_transport(tracker, env)
