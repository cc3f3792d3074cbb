"""Secrets in URLs (user info, signed query strings) and in MLFLOW_TRACKING_URI stay out of everything a run
writes or sends: config.json, every checkpoint, metrics.jsonl, the tracker's params and tags, stdout, the
logs and the error line. The run itself reads the real URLs; only what is serialised is redacted (redact.py).

The shards are served by a real nginx on 127.0.0.1 (which ignores the query strings); the tracker is a real
`mlflow server` (tests/integration/test_trackers.py's fixture).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from integration import test_trackers

from imagenet_train.ops.serve import NginxServer
from imagenet_train.redact import MARK

from conftest import SMALL_TRAIN, cli

mlflow_server = test_trackers.mlflow_server  # the fixture: a real `mlflow server` on 127.0.0.1
SIGNATURE, TOKEN, PASSWORD = "SIGNATURE-d34db33f", "TOKEN-c0ffee", "PASSWORD-5ecret"
SECRETS = (SIGNATURE, TOKEN, PASSWORD)


def signed_spec(base: str, names: list[str]) -> str:
    """The shards as a `::` list of URLs signed as a bucket signs them (one query string per URL)."""
    query = f"X-Amz-Credential=AKIA%2F{TOKEN}&X-Amz-Signature={SIGNATURE}&sig={SIGNATURE}&x-id=GetObject"
    return "::".join(f"{base}/{name}?{query}" for name in names)


def shard_names(folder: Path, split: str) -> tuple[list[str], int]:
    """The shard file names of `split` in an index folder, and its sample count."""
    index = json.loads((folder / "shards.json").read_text())["splits"][split]
    return [shard["url"] for shard in index["shardlist"]], index["nsamples"]


def leaks(text: str | bytes) -> list[str]:
    """The secrets that `text` holds."""
    data = text.encode() if isinstance(text, str) else text
    return [secret for secret in SECRETS if secret.encode() in data]


@pytest.mark.slow  # a real mlflow server and a training run (about a minute here); make faults runs it
def test_signed_shard_urls_and_a_tracking_password_stay_out_of_records_logs_and_mlflow(
    digit_shards, shard_server, tmp_path, mlflow_server, monkeypatch
):
    from mlflow import MlflowClient

    host = mlflow_server.removeprefix("http://")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:{PASSWORD}@{host}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "redaction")
    train, samples = shard_names(digit_shards, "train")
    val, _ = shard_names(digit_shards, "val")
    run_dir = tmp_path / "run"
    result = cli(
        "train",
        *("--train-urls", signed_spec(shard_server.url, train), "--val-urls", signed_spec(shard_server.url, val)),
        *("--train-samples", str(samples), "--num-classes", "10"),
        *SMALL_TRAIN,
        *("--workers", "1", "--epochs", "1", "--epoch-batches", "2", "--checkpoint-every", "1"),
        *("--run-dir", str(run_dir), "--tracker", "mlflow"),
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "View run" in result.stdout  # MLflow's own line, with the URI it was given
    assert leaks(result.stdout) == [] and leaks(result.stderr) == []
    saved = json.loads((run_dir / "config.json").read_text())["data"]
    assert saved["train_urls"].count(f"X-Amz-Signature={MARK}") == len(train)  # redacted, not dropped
    checkpoints = sorted((run_dir / "checkpoints").glob("*.pt"))
    assert checkpoints
    for path in checkpoints:
        state = torch.load(path, weights_only=True, map_location="cpu")
        assert state["config"]["data"]["val_urls"] == saved["val_urls"]
    written = [path for path in run_dir.rglob("*") if path.is_file()]
    assert run_dir / "metrics.jsonl" in written
    leaked = {str(path.relative_to(run_dir)): leaks(path.read_bytes()) for path in written}
    assert {name: found for name, found in leaked.items() if found} == {}
    client = MlflowClient(mlflow_server)
    run = client.get_run(test_trackers.tracker_id(run_dir))
    assert run.data.params["data.train_urls"] == saved["train_urls"]
    assert leaks(json.dumps([run.data.params, run.data.tags])) == []


def test_an_error_line_naming_a_signed_url_with_a_password_shows_neither(tmp_path):
    url = f"http://alice:{PASSWORD}@127.0.0.1:9/shards.json?X-Goog-Signature={SIGNATURE}&token={TOKEN}"
    result = cli("train", "--shards", url, "--io-timeout", "0", "--run-dir", str(tmp_path / "run"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert leaks(result.stderr) == [] and leaks(result.stdout) == []
    assert f"http://{MARK}@127.0.0.1:9/shards.json?X-Goog-Signature={MARK}&token={MARK}" in lines[0]


def test_a_loader_workers_warning_naming_a_signed_url_shows_no_secret(digit_shards, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (train, *_), _ = shard_names(digit_shards, "train")
    whole = (digit_shards / train).read_bytes()
    (served / "whole.tar").write_bytes(whole)
    (served / "cut.tar").write_bytes(whole[: len(whole) // 2])  # a broken shard: the worker warns, naming it
    with NginxServer(str(served)) as server:
        result = cli(
            "train",
            *("--train-urls", signed_spec(server.url, ["cut.tar", "whole.tar"]), "--train-samples", "130"),
            *("--num-classes", "10", *SMALL_TRAIN, "--workers", "1", "--epochs", "1", "--epoch-batches", "4"),
            *("--mode", "split", "--no-tensorboard", "--run-dir", str(tmp_path / "run")),
            timeout=300,
        )
    assert "broken shard" in result.stderr and "cut.tar" in result.stderr, result.stderr[-3000:]
    assert leaks(result.stderr) == [] and leaks(result.stdout) == []


def test_launch_prints_the_torchrun_command_with_its_signed_urls_redacted():
    url = f"http://127.0.0.1:9/train-{{0..3}}.tar?X-Amz-Signature={SIGNATURE}&X-Amz-Security-Token={TOKEN}"
    result = cli("launch", "--dry-run", "--", "train", "--train-urls", url)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"--train-urls http://127.0.0.1:9/train-{{0..3}}.tar?X-Amz-Signature={MARK}" in result.stdout
    assert leaks(result.stdout) == [] and leaks(result.stderr) == []
