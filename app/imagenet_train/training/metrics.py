"""Metrics for Prometheus: with --metrics-port each rank serves /metrics on that port plus its local rank, so a
node's ranks never collide and a PodMonitor lists one endpoint per local rank.

Names follow Prometheus' conventions (base units in the name, `_total` for counters, `_seconds`, `_bytes`, `_ratio`)
and every series carries `rank` and `node`. Nothing here reads a device tensor: the loss is the epoch's, taken from
its record, so the step never waits on the GPU for a metric.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.training.hooks import StepHook

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from imagenet_train.training.dist import DistInfo
    from imagenet_train.training.progress import DataWait

PREFIX = "imagenet_train_"
LABELS = ("rank", "node")
# A ResNet-50 step is ~50 ms on an H100 at batch 256 and seconds on a CPU: buckets from 10 ms to a minute.
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CHECKPOINT_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
DAMAGE = ("corrupt_samples", "broken_shards", "lost_samples")  # the loader's damage(), in its order
MEMORY_EVERY = 50  # steps between two reads of the CUDA allocator's counters (host calls, no sync)


class OutageSource(Protocol):
    """A loader that counts the I/O retries and outage seconds its workers met (loading/stream.py's EpochLoader)."""

    def outages(self) -> tuple[int, float]:
        """(I/O retries, seconds in outages) so far."""
        ...


class RunMetrics:
    """This rank's series, in a registry of its own; `serve` starts the HTTP endpoint for them."""

    def __init__(self, rank: int, node: str, registry: CollectorRegistry | None = None):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry or CollectorRegistry()
        labels = {"rank": str(rank), "node": node}
        self.labels = [labels[name] for name in LABELS]

        def made(kind: type, name: str, doc: str, **options: object):  # one labelled child of a metric
            return kind(PREFIX + name, doc, LABELS, registry=self.registry, **options).labels(**labels)

        self.samples = made(Counter, "samples", "samples this rank trained on")
        self.steps = made(Counter, "steps", "training steps this rank took")
        self.step_seconds = made(
            Histogram,
            "step_seconds",
            "wall time of one training iteration, its data wait included",
            buckets=STEP_BUCKETS,
        )
        self.data_wait = made(Gauge, "data_wait_ratio", "share of the epoch so far spent waiting for a batch")
        self.loss = made(Gauge, "train_loss", "mean training loss of the last finished epoch (all ranks)")
        self.top1 = made(Gauge, "eval_top1_ratio", "top-1 accuracy of the last evaluation")
        self.epoch = made(Gauge, "epoch", "the epoch being trained (0-based)")
        self.samples_seen = made(Gauge, "samples_seen", "samples all ranks trained on up to the last finished epoch")
        self.damage = {
            name: made(Counter, name, f"{name.replace('_', ' ')} met by this rank's loader") for name in DAMAGE
        }
        self.checkpoint_seconds = made(
            Histogram, "checkpoint_write_seconds", "time to write one checkpoint", buckets=CHECKPOINT_BUCKETS
        )
        self.last_checkpoint = made(
            Gauge,
            "last_checkpoint_timestamp_seconds",
            "Unix time the last checkpoint was written (by rank 0; every rank learns it)",
        )
        self.memory = made(Gauge, "cuda_memory_allocated_bytes", "CUDA memory held by tensors on this rank's device")
        self.peak_memory = made(Gauge, "cuda_memory_peak_bytes", "the most CUDA memory tensors held on this device")
        self.damage_seen = (0, 0, 0)
        self.samples_total = 0

    @classmethod
    def serve(cls, port: int, info: DistInfo, host: str = "") -> RunMetrics:
        """Metrics for this rank, served on `port` plus the local rank (every interface unless `host`)."""
        from prometheus_client import start_http_server

        metrics = cls(info.rank, socket.gethostname())
        rank_port = port + info.local_rank
        try:
            start_http_server(rank_port, addr=host or "0.0.0.0", registry=metrics.registry)
        except OSError as error:
            raise ImagenetTrainError(
                f"--metrics-port {port}: rank {info.rank} cannot serve metrics on port {rank_port} ({error.strerror}); "
                "expected a free port (each local rank takes --metrics-port plus its local rank)"
            ) from None
        return metrics

    def at(self, epoch: int, wait: DataWait, device: torch.device) -> StepHook:
        """This epoch's per-step hook: samples, steps, iteration time, the data wait and CUDA memory."""
        self.epoch.set(epoch)
        return _StepMetrics(self, wait, device)

    def epoch_end(self, record: dict, damage: tuple[int, int, int]) -> None:
        """The finished epoch's record (the same on every rank) and this rank's loader damage so far."""
        self.loss.set(record["train_loss"])
        if "top1" in record:
            self.top1.set(record["top1"])
        self.samples_total += record["train_samples"]
        self.samples_seen.set(record.get("samples_seen", self.samples_total))
        for name, now, before in zip(DAMAGE, damage, self.damage_seen, strict=True):
            if now > before:
                self.damage[name].inc(now - before)
        self.damage_seen = damage

    def checkpoint_written(self, seconds: float) -> None:
        """A checkpoint was written, taking `seconds` from the save's start to every rank knowing it was."""
        self.checkpoint_seconds.observe(seconds)
        self.last_checkpoint.set(time.time())

    def count_outages(self, loaders: Sequence[OutageSource]) -> None:
        """Report the loaders' I/O retries and outage seconds, read when Prometheus scrapes (the step pays nothing)."""
        self.registry.register(_Outages(loaders, self.labels))


class _Outages:
    """The I/O retries and outage seconds of a rank's loaders, as two counters read at each scrape: the workers
    that wait the outages out count them in shared memory (io/outage_tally.py), where a scrape reads them live."""

    def __init__(self, loaders: Sequence[OutageSource], labels: list[str]):
        self.loaders, self.labels = loaders, labels

    def collect(self) -> Iterator:
        """The two counters, summed over the loaders."""
        from prometheus_client.core import CounterMetricFamily

        counts = [loader.outages() for loader in self.loaders]
        retries = CounterMetricFamily(
            PREFIX + "io_retries", "reads this rank's loaders retried after a failure (an outage)", labels=LABELS
        )
        retries.add_metric(self.labels, sum(count for count, _ in counts))
        seconds = CounterMetricFamily(
            PREFIX + "io_outage_seconds", "seconds this rank's loaders spent waiting out outages", labels=LABELS
        )
        seconds.add_metric(self.labels, sum(spent for _, spent in counts))
        yield from (retries, seconds)


class _StepMetrics(StepHook):
    def __init__(self, metrics: RunMetrics, wait: DataWait, device: torch.device):
        self.metrics, self.wait, self.cuda = metrics, wait, device.type == "cuda"
        self.device = device
        self.batch = 0
        self.last = time.perf_counter()

    def before_step(self, step: int, keys: list[str]) -> None:
        """Note the batch's size."""
        self.batch = len(keys)

    def after_step(self, step: int) -> bool:
        """Count the step and its samples; time it from the end of the one before."""
        now = time.perf_counter()
        metrics = self.metrics
        metrics.step_seconds.observe(now - self.last)
        self.last = now
        metrics.samples.inc(self.batch)
        metrics.steps.inc()
        metrics.data_wait.set(self.wait.fraction)
        if self.cuda and step % MEMORY_EVERY == 0:
            metrics.memory.set(torch.cuda.memory_allocated(self.device))
            metrics.peak_memory.set(torch.cuda.max_memory_allocated(self.device))
        return False


class NoMetrics:
    """Without --metrics-port: the same calls, doing nothing."""

    def at(self, epoch: int, wait: DataWait, device: torch.device) -> StepHook:
        """A hook that does nothing."""
        return StepHook()

    def epoch_end(self, record: dict, damage: tuple[int, int, int]) -> None:
        """Nothing to record."""

    def checkpoint_written(self, seconds: float) -> None:
        """Nothing to record."""

    def count_outages(self, loaders: Sequence[OutageSource]) -> None:
        """Nothing to report."""


def run_metrics(port: int, info: DistInfo) -> RunMetrics | NoMetrics:
    """This rank's metrics: served when `port` is set (--metrics-port), nothing otherwise."""
    return RunMetrics.serve(port, info) if port else NoMetrics()
