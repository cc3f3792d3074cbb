"""TensorBoard events from a real DDP run, read back with TensorBoard's own reader; `report` PNGs and table."""

from __future__ import annotations

import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from imagenet_train.training.progress import DataWait

from conftest import SMALL_TRAIN, cli, read_metrics, torchrun


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
    for name in ("loss", "accuracy", "throughput", "data_wait", "batches_per_rank", "samples_seen", "overview"):
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
