"""A real Prometheus (Debian's `prometheus`) on 127.0.0.1 scrapes a 2-rank torchrun run's /metrics: every query of
the chart's Grafana dashboard answers with a series for each rank, read back through Prometheus' HTTP API."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_server import adjacent_ports, serving

from conftest import REPO, SMALL_TRAIN

PROMETHEUS = shutil.which("prometheus")
DASHBOARD = REPO / "helm" / "imagenet-train" / "files" / "dashboard.json"
WAIT_S = 300  # a loaded 2-core machine: torchrun start-up, a few epochs, 1 s scrapes

# A torchrun run scraped until every query answers (about a minute): make faults runs it; tests/unit/test_run_metrics.py
# checks the series themselves in make test.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus (make system-deps installs it)"),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard the chart ships."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """Prometheus on 127.0.0.1 scraping 127.0.0.1:P and P + 1 every second; yields (its URL, P)."""
    metrics_port, web_port = adjacent_ports(), free_port()
    config = tmp_path / "prometheus.yml"
    targets = [f"127.0.0.1:{metrics_port}", f"127.0.0.1:{metrics_port + 1}"]
    config.write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [{"job_name": "imagenet-train", "static_configs": [{"targets": targets}]}],
            }
        )
    )
    command = [
        str(PROMETHEUS),
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{web_port}",
    ]
    url = f"http://127.0.0.1:{web_port}"
    with (tmp_path / "prometheus.log").open("w") as log, serving(command, f"{url}/-/ready", 60, log):
        yield url, metrics_port


def ranks_answering(url: str, query: str) -> dict[str, float]:
    """rank -> value of an instant query's series."""
    address = f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(address, timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return {series["metric"].get("rank", "?"): float(series["value"][1]) for series in body["data"]["result"]}


def complete(answered: dict[str, dict[str, float]], throughput: str) -> bool:
    """Every query has both ranks' series, both are training, and an epoch has ended (its loss is set)."""
    both = all(set(ranks) == {"0", "1"} for ranks in answered.values())
    losses = answered.get("imagenet_train_train_loss", {})
    return both and all(v > 0 for v in answered[throughput].values()) and all(v > 0 for v in losses.values())


def test_every_dashboard_query_answers_for_both_ranks_of_a_torchrun_run(prometheus, digit_shards, tmp_path):
    url, metrics_port = prometheus
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "imagenet_train.cli",
        "train",
        *SMALL_TRAIN,
        "--shards",
        str(digit_shards),
        "--run-dir",
        str(tmp_path / "run"),
        "--epochs",
        "100",
        "--epoch-batches",
        "4",
        "--metrics-port",
        str(metrics_port),
    ]
    output = (tmp_path / "torchrun.log").open("w")
    run = subprocess.Popen(
        command,
        stdout=output,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    queries, answered = dashboard_queries(), {}
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and run.poll() is None:
            answered = {query: ranks_answering(url, query) for query in queries}
            if complete(answered, queries[0]):
                break
            time.sleep(2)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGTERM)  # a clean stop: the run checkpoints and leaves
        try:
            run.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        output.close()
    log = (tmp_path / "torchrun.log").read_text()
    missing = {query: sorted(ranks) for query, ranks in answered.items() if set(ranks) != {"0", "1"}}
    assert answered and not missing, f"queries without both ranks: {missing}\n{log[-3000:]}"
    assert complete(answered, queries[0]), answered  # samples per second and the last epoch's loss, each rank
    assert all(0 <= value <= 1 for value in answered["imagenet_train_data_wait_ratio"].values())
