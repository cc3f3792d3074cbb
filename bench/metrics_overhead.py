"""The training step with Prometheus metrics off and on, side by side in one process (docs/benchmarks.md).

A step is resnet18's forward, loss, backward and SGD update on a batch already in memory, with the trainer's step
hooks called around it as the loop calls them: off, the hook `NoMetrics` hands out (what a run without
--metrics-port gets); on, `RunMetrics.serve`'s hook (the exporter updates its counters, histogram and gauges every
step) with its HTTP server scraped every `--scrape` seconds meanwhile. Rounds alternate off/on and on/off (ABBA) so a
drift of the shared machine's speed falls on both; the figure is the ratio on/off of each round's median step time,
and its median over the rounds.

    PYTHONPATH=app python bench/metrics_overhead.py [--rounds 8 --steps 10 --size 64 --batch 32 --threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable

import torch
from common import machine

from imagenet_train.ops.serve import free_port
from imagenet_train.training.dist import DistInfo
from imagenet_train.training.hooks import StepHook
from imagenet_train.training.metrics import NoMetrics, RunMetrics
from imagenet_train.training.progress import DataWait


def step_function(size: int, batch: int) -> Callable[[], None]:
    """One SGD step of resnet18 on a fixed random batch."""
    import torchvision

    model = torchvision.models.resnet18(num_classes=1000)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images, labels = torch.randn(batch, 3, size, size), torch.randint(0, 1000, (batch,))
    loss_of = torch.nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_of(model(images), labels).backward()
        optimizer.step()

    return step


def timed_steps(step: Callable[[], None], hook: StepHook, steps: int, batch: int, first: int) -> list[float]:
    """Seconds of each of `steps` steps with `hook` called around them, as the training loop calls it."""
    keys = [f"k{i}" for i in range(batch)]
    times = []
    for index in range(first, first + steps):
        began = time.perf_counter()
        hook.before_step(index, keys)
        step()
        hook.after_step(index)
        times.append(time.perf_counter() - began)
    return times


def hook_seconds(hook: StepHook, calls: int, batch: int) -> float:
    """Seconds one step's hook calls take alone, the mean of `calls` (before_step and after_step, no step)."""
    keys = [f"k{i}" for i in range(batch)]
    began = time.perf_counter()
    for index in range(calls):
        hook.before_step(index, keys)
        hook.after_step(index)
    return (time.perf_counter() - began) / calls


class Scraper:
    """Reads /metrics every `interval` s while `active`, as Prometheus would."""

    def __init__(self, url: str, interval: float):
        self.url, self.interval = url, interval
        self.active, self.done, self.scrapes = threading.Event(), threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.interval):
            if self.active.is_set():
                with urllib.request.urlopen(self.url, timeout=10) as answer:
                    answer.read()
                self.scrapes += 1


def main() -> None:
    """Interleaved rounds off/on; prints each round and the median ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="steps per half-round")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--scrape", type=float, default=1.0, help="seconds between scrapes of /metrics")
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    step = step_function(options.size, options.batch)
    port = free_port()
    metrics = RunMetrics.serve(port, DistInfo(0, 1, 0, torch.device("cpu")), host="127.0.0.1")
    hooks = {
        "off": NoMetrics().at(0, DataWait(), torch.device("cpu")),
        "on": metrics.at(0, DataWait(), torch.device("cpu")),
    }
    scraper = Scraper(f"http://127.0.0.1:{port}/metrics", options.scrape)
    timed_steps(step, hooks["off"], 3, options.batch, 0)  # warm-up
    print(f"{machine()}; torch {torch.__version__}, {options.threads} threads; load {os.getloadavg()[0]:.1f}")
    ratios, steps_off, at = [], [], 3
    for round_ in range(options.rounds):
        medians = {}
        for name in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
            (scraper.active.set if name == "on" else scraper.active.clear)()
            medians[name] = statistics.median(timed_steps(step, hooks[name], options.steps, options.batch, at))
            at += options.steps
        ratios.append(medians["on"] / medians["off"])
        steps_off.append(medians["off"])
        print(
            f"round {round_ + 1}: off {medians['off'] * 1000:.1f} ms, on {medians['on'] * 1000:.1f} ms, "
            f"on/off {ratios[-1]:.3f}",
            flush=True,
        )
    scraper.done.set()
    print(
        f"on/off: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}) over "
        f"{options.rounds} rounds of {options.steps} steps each way; {scraper.scrapes} scrapes; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    # The hooks alone, many calls: what metrics add to a step, measured without the step's noise around it.
    alone = {
        name: statistics.median(hook_seconds(hooks[name], 20000, options.batch) for _ in range(5)) for name in hooks
    }
    added = alone["on"] - alone["off"]
    print(
        f"hook calls per step alone (median of 5 x 20000): off {alone['off'] * 1e6:.1f} us, "
        f"on {alone['on'] * 1e6:.1f} us; added {added * 1e6:.1f} us = "
        f"{added / statistics.median(steps_off):.1e} of a step"
    )


if __name__ == "__main__":
    main()
