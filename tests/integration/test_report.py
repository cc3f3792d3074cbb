"""TensorBoard events from a real DDP run, read back with TensorBoard's own reader; `report` PNGs and table."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from imagenet_train.training.progress import DataWait

from conftest import LONG_EPOCH, SMALL_TRAIN, cli, inside_first_epoch, read_metrics, torchrun


def test_a_ddp_run_writes_tensorboard_events_and_report_plots_them(shard_server, tmp_path):
    run_dir = tmp_path / "run"
    args = ["--shards", f"{shard_server.url}/shards.json", "--run-dir", str(run_dir), "--epochs", "2"]
    result = torchrun([*args, "--epoch-batches", "6", *SMALL_TRAIN, "--workers", "1"])
    assert result.returncode == 0, result.stderr[-3000:]

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {"train/loss", "train/lr", "val/top1", "val/top5", "perf/samples_per_s", "perf/data_wait_fraction"}
    assert expected | {"batches_per_rank/rank0", "batches_per_rank/rank1"} <= tags
    assert [s.step for s in events.Scalars("val/top1")] == [6, 12]  # global step at each epoch's end
    assert [s.value for s in events.Scalars("batches_per_rank/rank1")] == [6, 6]
    metrics = read_metrics(run_dir)
    assert [s.value for s in events.Scalars("val/top1")] == pytest.approx([m["top1"] for m in metrics])
    assert all(0 < s.value < 1 for s in events.Scalars("perf/data_wait_fraction"))

    report = cli("report", str(run_dir))
    assert report.returncode == 0, report.stderr
    lines = report.stdout.splitlines()
    assert lines[0].split()[:3] == ["epoch", "train", "loss"]
    assert [line.split()[0] for line in lines[1:3]] == ["0", "1"]
    plots = ("loss", "accuracy", "learning_rate", "throughput", "data_wait", "batches_per_rank", "samples_seen")
    for name in (*plots, "overview"):
        png = run_dir / "report" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_no_tensorboard_writes_no_events(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    args = ["--shards", str(digit_shards), "--run-dir", str(run_dir), "--epochs", "1", "--epoch-batches", "2"]
    result = torchrun([*args, *SMALL_TRAIN, "--workers", "0", "--no-tensorboard"], nproc=1)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / "metrics.jsonl").is_file() and not (run_dir / "tensorboard").exists()


def test_report_of_a_directory_without_metrics_is_a_one_line_error(tmp_path):
    result = cli("report", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == f"imagenet-train: error: report: {tmp_path / 'metrics.jsonl'} not found " + (
        "(give a run directory written by `imagenet-train train`)"
    )


def slow_items(count: int, delay: float):
    for item in range(count):
        time.sleep(delay)
        yield item


def test_data_wait_is_the_share_of_loop_time_spent_in_next():
    starved = DataWait()
    for _ in starved.timed(slow_items(5, 0.04)):
        pass
    busy = DataWait()
    for _ in busy.timed(range(5)):
        time.sleep(0.04)
    assert starved.fraction > 0.9 and busy.fraction < 0.1
    assert DataWait().fraction == 0.0


def test_samples_seen_counts_the_steps_a_resumed_epoch_took_before_its_checkpoint():
    from imagenet_train.ops.run_report import samples_seen

    records = [
        {"epoch": 0, "train_samples": 768, "batches_per_rank": [12, 12]},
        {"epoch": 1, "train_samples": 512, "batches_per_rank": [8, 8], "resumed_from_step": 4},
    ]
    assert samples_seen(records) == [768, 1536]


# -- a one-epoch run without validation, and runs stopped before their first epoch ended -------------------
def _train_only(shards: Path) -> list[str]:
    """--train-urls over the digits' train shards, no val shards: a run without validation."""
    urls = f"{shards}/imagenet-train-train-{{000000..000011}}.tar"
    return ["--train-urls", urls, "--train-samples", "1438", "--num-classes", "10"]


def test_a_one_epoch_run_without_validation_reports_without_warnings_empty_panels_or_a_plural(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    args = [*_train_only(digit_shards), "--run-dir", str(run_dir), "--epochs", "1", "--epoch-batches", "3"]
    result = torchrun([*args, *SMALL_TRAIN, "--workers", "0"], nproc=1)
    assert result.returncode == 0, result.stderr[-3000:]
    report = cli("report", str(run_dir))
    assert report.returncode == 0 and report.stderr == "", report.stderr  # on abc5a5b: matplotlib's legend warning
    assert (run_dir / "report" / "learning_rate.png").read_bytes()[:4] == b"\x89PNG"

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from imagenet_train.ops.report_plots import PLOTS, overview_title, styled
    from imagenet_train.ops.run_report import read_records

    records = read_records(run_dir)
    assert overview_title("run", records) == "run: 1 epoch"
    for name, draw in PLOTS.items():
        figure, ax = plt.subplots()
        styled(ax, draw, records)
        low, high = ax.get_xlim()
        if name == "accuracy":  # said in words, no axes: not an empty plot with ticks from -0.045 to 0.045
            assert not ax.axison and [text.get_text() for text in ax.texts] == ["no validation in this run"]
        else:
            assert [tick for tick in ax.get_xticks() if low <= tick <= high] == [0], name
        if name == "learning_rate":
            assert list(ax.lines[0].get_ydata()) == [read_metrics(run_dir)[0]["lr"]]
        plt.close(figure)


@contextlib.contextmanager
def _training(args: list[str], log: Path) -> Iterator[subprocess.Popen]:
    """`imagenet-train train ARGS` as one process in a session of its own, its output in `log`."""
    command = [str(Path(sys.executable).with_name("imagenet-train")), "train", *args]
    with open(log, "w") as output:
        environment = {**os.environ, "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _wait_for(condition, seconds: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {seconds:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _stopped(process: subprocess.Popen, log: Path) -> str:
    """SIGTERM to the run; its output once it has left (with 143)."""
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=120)
    assert code == 128 + signal.SIGTERM, f"exit {code}:\n{log.read_text()[-3000:]}"
    return log.read_text()


def test_report_of_a_run_stopped_inside_its_first_epoch_says_what_the_run_has(digit_shards, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    args = [*_train_only(digit_shards), "--run-dir", str(run_dir), "--epochs", "1", *SMALL_TRAIN, *LONG_EPOCH]
    with _training([*args, "--workers", "1"], log) as process:
        _wait_for(lambda: inside_first_epoch(log.read_text()), 240, "steps of the first epoch", log)
        output = _stopped(process, log)
    assert "continue with --resume latest" in output, output[-2000:]
    (checkpoint,) = (run_dir / "checkpoints").glob("epoch-0000-step-*.pt")
    steps = int(checkpoint.stem.rsplit("-", 1)[1])
    report = cli("report", str(run_dir))
    assert report.returncode == 2
    assert report.stderr.strip() == (
        f"imagenet-train: error: report: {run_dir / 'metrics.jsonl'} not found (no epoch finished yet: {steps} steps "
        f"of epoch 0 logged, checkpoint {checkpoint.name}; `train --resume latest` continues it)"
    )


@contextlib.contextmanager
def _silent_server() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections and never answers: a run from it never gets a batch."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()


def test_a_stop_before_the_first_step_suggests_no_resume_and_report_says_there_is_nothing_to_resume(tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    with _silent_server() as port:
        urls = f"http://127.0.0.1:{port}/train-{{000000..000001}}.tar"
        data = ["--train-urls", urls, "--train-samples", "256", "--num-classes", "10"]
        args = [*data, "--run-dir", str(run_dir), "--epochs", "1", *SMALL_TRAIN, "--workers", "1"]
        with _training(args, log) as process:
            _wait_for((run_dir / "config.json").is_file, 240, "config.json", log)
            time.sleep(2)  # the rank now waits for its first batch, which never comes
            output = _stopped(process, log)
    line = next(line for line in output.splitlines() if "exiting without a checkpoint" in line)
    assert "(no step taken yet); continue by running the same command again: there is no checkpoint" in line, line
    assert "--resume" not in output, output[-2000:]  # on abc5a5b: "continue with --resume latest"
    report = cli("report", str(run_dir))
    assert report.returncode == 2
    assert "config.json only: no epoch finished yet and no checkpoint, nothing to resume" in report.stderr
    assert "--resume" not in report.stderr and "written by" not in report.stderr, report.stderr
