"""--tracker against the trackers themselves: a real `mlflow server` on 127.0.0.1 (sqlite in tmp_path) read back with
MlflowClient, W&B in offline mode read back from its own run files, and a tracker that is down."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagenet_train.ops.serve import free_port

from conftest import SMALL_TRAIN, read_metrics, torchrun

# Two epochs of two steps each, at the size of SMALL_TRAIN's: the trackers get a line per epoch either way.
RUN = [*SMALL_TRAIN, "--workers", "1", "--epoch-batches", "2", "--shuffle-buffer", "50"]


def flat_config(run_dir: Path) -> dict[str, object]:
    """config.json as 'section.name' -> value."""
    resolved = json.loads((run_dir / "config.json").read_text())
    return {f"{section}.{key}": value for section, values in resolved.items() for key, value in values.items()}


def tracker_id(run_dir: Path) -> str:
    """The tracker run id the run directory keeps for --resume."""
    return json.loads((run_dir / "tracker.json").read_text())["run_id"]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> Iterator[str]:
    """`mlflow server` on a free port of 127.0.0.1 with a sqlite store in a temp dir; its URL. Stopped by its PID
    (its process group: uvicorn's worker included)."""
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    command = [
        str(Path(sys.executable).with_name("mlflow")),
        "server",
        *("--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}"),
        *("--default-artifact-root", str(folder / "artifacts")),
        *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
    ]
    environment = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job runner processes
    with open(folder / "server.log", "wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=output, env=environment, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not start:\n{(folder / 'server.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_mlflow_run_holds_params_epoch_metrics_and_final_checkpoint_and_resume_continues_it(
    digit_shards, tmp_path, mlflow_server, monkeypatch
):
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "digits")
    run_dir = tmp_path / "run"
    args = ["--shards", str(digit_shards), *RUN, "--run-dir", str(run_dir), "--tracker", "mlflow"]
    first = torchrun([*args, "--epochs", "1"])
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = tracker_id(run_dir)
    client = MlflowClient(mlflow_server)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "digits"
    config = flat_config(run_dir)
    assert set(run.data.params) == set(config)  # every setting and derived value, flattened
    assert run.data.params["derived.world_size"] == "2"
    assert run.data.params["run.tracker"] == "mlflow"
    assert float(run.data.params["derived.base_lr"]) == config["derived.base_lr"]
    assert run.data.tags["final_checkpoint"] == str((run_dir / "final.pt").resolve())

    second = torchrun([*args, "--epochs", "2", "--resume", "latest"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert tracker_id(run_dir) == run_id
    assert f"tracker mlflow: run {run_id} resumed" in second.stdout
    lines = read_metrics(run_dir)
    assert [line["epoch"] for line in lines] == [0, 1]
    for name in ("train_loss", "top1", "lr", "samples_per_s"):
        history = sorted(client.get_metric_history(run_id, name), key=lambda metric: metric.step)
        assert [(m.step, m.value) for m in history] == [(line["epoch"], pytest.approx(line[name])) for line in lines]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id])) == 1  # the resume made no second run


def wandb_records(path: Path) -> Iterator[object]:
    """The records of a W&B run file (run-ID.wandb), parsed with wandb's own protobuf Record: the file is a LevelDB
    log (32 KiB blocks of chunks, each with a 7-byte header) after a 7-byte ':W&B' header."""
    from wandb.proto import wandb_internal_pb2

    data, position, chunks, block = path.read_bytes(), 7, [], 32768
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunks.append(data[position + 7 : position + 7 + length])
        position += 7 + length
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def item_values(items) -> dict[str, object]:
    """A history/config/summary record's items as name -> value."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


@pytest.mark.slow  # two torchrun runs (~30 s of CPU): `make faults` runs it with test_resume.py's slow ones
def test_wandb_offline_run_holds_params_and_epoch_metrics_and_resume_reuses_its_id(digit_shards, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-files"))
    monkeypatch.setenv("WANDB_PROJECT", "digits")
    run_dir = tmp_path / "run"
    args = ["--shards", str(digit_shards), *RUN, "--run-dir", str(run_dir), "--tracker", "wandb"]
    first = torchrun([*args, "--epochs", "1"])
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = tracker_id(run_dir)
    second = torchrun([*args, "--epochs", "2", "--resume", "latest"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert tracker_id(run_dir) == run_id

    folders = sorted((tmp_path / "wandb-files" / "wandb").glob("offline-run-*"))
    assert [folder.name.rsplit("-", 1)[1] for folder in folders] == [run_id, run_id]  # one run, written twice
    history, config, summary, projects = {}, {}, {}, set()
    for folder in folders:
        for record in wandb_records(folder / f"run-{run_id}.wandb"):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                values = item_values(record.history.item)
                history[values["epoch"]] = values
            elif kind == "config":
                config.update(item_values(record.config.update))
            elif kind == "summary":
                summary.update(item_values(record.summary.update))
            elif kind == "run":
                projects.add(record.run.project)
    assert projects == {"digits"}
    lines = read_metrics(run_dir)
    assert sorted(history) == [line["epoch"] for line in lines] == [0, 1]
    for line in lines:
        for name in ("train_loss", "top1", "lr", "train_samples"):
            assert history[line["epoch"]][name] == pytest.approx(line[name])
    assert {key: value for key, value in config.items() if not key.startswith("_")} == flat_config(run_dir)
    assert summary["final_checkpoint"] == str((run_dir / "final.pt").resolve())


@pytest.mark.slow  # a torchrun run (~15 s); make test has the sink's own test against a closed port below
def test_a_tracker_that_is_down_does_not_stop_or_hold_up_training(digit_shards, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port('127.0.0.1')}")  # nothing listens
    run_dir = tmp_path / "run"
    started = time.monotonic()
    result = torchrun(
        ["--shards", str(digit_shards), *RUN, "--run-dir", str(run_dir), "--tracker", "mlflow", "--epochs", "1"]
    )
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line["epoch"] for line in read_metrics(run_dir)] == [0]
    assert (run_dir / "final.pt").is_file()
    assert not (run_dir / "tracker.json").exists()
    failures = result.stderr.count("tracker mlflow: ")
    assert 1 <= failures <= 2 + int(seconds // 60)  # once a minute at most, plus the end's count of what is left
    assert "calls not sent by the end of the run" in result.stderr


def test_sends_to_a_tracker_that_is_down_return_at_once_and_warn_once_a_minute(tmp_path, monkeypatch, caplog):
    from imagenet_train.rundir.trackers import TrackerSink

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port('127.0.0.1')}")  # nothing listens
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    sink = TrackerSink("mlflow", tmp_path, resume=False)
    started = time.monotonic()
    sink.begin({"run": {"arch": "resnet18"}})
    for epoch in range(50):
        sink.epoch({"epoch": epoch, "train_loss": 1.0})
    queued = time.monotonic() - started
    assert queued < 0.5  # what the training loop waits: queueing only
    started = time.monotonic()
    sink.close(timeout=20)
    assert time.monotonic() - started < 20
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tracker mlflow: ")]
    assert len(warnings) == 2, (
        warnings
    )  # one failure line within the minute; the start, 50 epochs and the finish unsent
    assert "ConnectionError" in warnings[0] or "MlflowException" in warnings[0]
    assert warnings[1] == "tracker mlflow: 52 calls not sent by the end of the run " + (
        "(metrics.jsonl and config.json hold it all)"
    )


def test_tracker_without_its_library_is_one_line_and_exit_2(digit_shards, tmp_path):
    # sys.modules[name] = None is Python's own way to make a module unimportable (as if not installed).
    code = (
        "import sys; sys.modules['wandb'] = None; from imagenet_train.cli import main; "
        f"sys.exit(main(['train', '--shards', {str(digit_shards)!r}, '--tracker', 'wandb', "
        f"'--run-dir', {str(tmp_path / 'run')!r}]))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith("--tracker wandb: the wandb library is not installed; pip install 'imagenet-train[wandb]'")
    )
    assert not (tmp_path / "run").exists()
