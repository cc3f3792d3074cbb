"""The Prometheus series a rank exports (training/metrics.py), read back in Prometheus' text format."""

from __future__ import annotations

import re

import pytest
import torch
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from imagenet_train.training.hooks import StepHook
from imagenet_train.training.metrics import NoMetrics, RunMetrics
from imagenet_train.training.progress import DataWait

pytestmark = pytest.mark.unit

# Prometheus' naming rules: a counter's samples end in _total, units are base units spelled out.
NAME = re.compile(r"imagenet_train_[a-z0-9_]+")


def samples(metrics: RunMetrics) -> dict[str, float]:
    """Every sample's name and labels -> value."""
    text = generate_latest(metrics.registry).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in ("rank", "node"))
            found[f"{sample.name}{{{labels}}}"] = sample.value
            assert sample.labels["rank"] == "3" and sample.labels["node"] == "node-a"
    return found


def test_a_step_hook_counts_samples_steps_and_times_each_iteration() -> None:
    metrics = RunMetrics(rank=3, node="node-a")
    hook = metrics.at(epoch=2, wait=DataWait(), device=torch.device("cpu"))
    for step in range(4):
        hook.before_step(step, [f"key{i}" for i in range(8)])
        assert hook.after_step(step) is False  # a metric never ends the epoch
    found = samples(metrics)
    assert found["imagenet_train_samples_total{}"] == 32
    assert found["imagenet_train_steps_total{}"] == 4
    assert found["imagenet_train_step_seconds_count{}"] == 4
    assert found["imagenet_train_epoch{}"] == 2


def test_an_epoch_end_sets_loss_and_top1_and_counts_only_new_damage() -> None:
    metrics = RunMetrics(rank=3, node="node-a")
    metrics.epoch_end({"train_loss": 1.5, "top1": 0.25, "train_samples": 100}, (2, 1, 30))
    metrics.epoch_end({"train_loss": 1.25, "train_samples": 100, "samples_seen": 250}, (5, 1, 30))
    found = samples(metrics)
    assert found["imagenet_train_train_loss{}"] == 1.25
    assert found["imagenet_train_eval_top1_ratio{}"] == 0.25  # an epoch without evaluation keeps the last score
    assert found["imagenet_train_corrupt_samples_total{}"] == 5  # the loader's running count, not summed twice
    assert found["imagenet_train_broken_shards_total{}"] == 1
    assert found["imagenet_train_lost_samples_total{}"] == 30
    assert found["imagenet_train_samples_seen{}"] == 250


def test_a_checkpoint_sets_its_time_and_duration() -> None:
    metrics = RunMetrics(rank=3, node="node-a")
    metrics.checkpoint_written(2.0)
    found = samples(metrics)
    assert found["imagenet_train_checkpoint_write_seconds_sum{}"] == 2.0
    assert found["imagenet_train_last_checkpoint_timestamp_seconds{}"] > 1.7e9


def test_every_series_follows_prometheus_naming() -> None:
    metrics = RunMetrics(rank=3, node="node-a")
    metrics.count_outages([])
    text = generate_latest(metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        assert NAME.fullmatch(family.name), family.name
        for sample in family.samples:
            if family.type == "counter":
                assert sample.name.endswith(("_total", "_created")), sample.name
            if family.type == "histogram":
                assert family.name.endswith("_seconds"), family.name


def test_without_a_port_the_calls_do_nothing() -> None:
    off = NoMetrics()
    hook = off.at(0, DataWait(), torch.device("cpu"))
    assert type(hook) is StepHook
    off.epoch_end({"train_loss": 1.0, "train_samples": 1}, (0, 0, 0))
    off.checkpoint_written(1.0)
    off.count_outages([])


class Loader:
    """A loader whose workers' retries and outage seconds the test sets."""

    def __init__(self, retries: int, seconds: float):
        self.counts = (retries, seconds)

    def outages(self) -> tuple[int, float]:
        return self.counts


def test_io_retries_and_outage_seconds_are_the_loaders_sum_read_at_each_scrape() -> None:
    metrics = RunMetrics(rank=3, node="node-a")
    train, val = Loader(2, 1.5), Loader(1, 0.25)
    metrics.count_outages([train, val])
    found = samples(metrics)
    assert found["imagenet_train_io_retries_total{}"] == 3
    assert found["imagenet_train_io_outage_seconds_total{}"] == 1.75
    train.counts = (7, 31.5)  # the workers rode out another outage: the next scrape sees it, no step needed
    found = samples(metrics)
    assert found["imagenet_train_io_retries_total{}"] == 8
    assert found["imagenet_train_io_outage_seconds_total{}"] == 31.75
