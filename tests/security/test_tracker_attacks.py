"""A hostile tracker server: its answers are bounded in bytes, it costs a warning and never the run, and a run does
not send it credentials over plain http.

The server poses as MLflow's on 127.0.0.1 (a real `http.server`) and answers every request with 256 MiB, with a
Content-Length or without one (read until the connection closes). Rank 0's tracker sink runs in a child process
that reports its own peak RSS (getrusage) before the sink starts and after it closed.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagenet_train.ops.serve import free_port

from conftest import cli

HUGE = 256 << 20
PIECE = b'{"experiment": {"name": "' + b"a" * ((1 << 20) - 26)  # 1 MiB of a JSON answer that never ends


class _HugeAnswers(http.server.BaseHTTPRequestHandler):
    """Answers every GET and POST with 200 and HUGE bytes; `declared`: with a Content-Length."""

    declared = True
    requests: list[str]

    def _answer(self) -> None:
        self.requests.append(f"{self.command} {self.path}")
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.declared:
            self.send_header("Content-Length", str(HUGE))
        self.end_headers()
        try:
            for start in range(0, HUGE, len(PIECE)):
                self.wfile.write(PIECE[: HUGE - start])
        except OSError:  # the client stopped reading: what a bounded one does
            pass
        self.close_connection = True

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture(params=["content-length", "until-close"])
def huge_tracker(request) -> Iterator[type[_HugeAnswers]]:
    """The hostile server; its handler class holds its URL and the requests it answered."""
    handler = type("Huge", (_HugeAnswers,), {"declared": request.param == "content-length", "requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    server.daemon_threads = True
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# Rank 0's sink, as a run drives it: start, two epochs, close; the peak RSS around it, in KiB.
CHILD = """
import json, logging, resource, sys
import mlflow
from imagenet_train.rundir.trackers import TrackerSink
warnings = []
class Kept(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.basicConfig(level=logging.WARNING, handlers=[logging.StreamHandler(sys.stderr), Kept()])
mlflow.MlflowClient()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sink = TrackerSink("mlflow", sys.argv[1], resume=False)
sink.begin({"run": {"arch": "resnet18"}})
for epoch in range(2):
    sink.epoch({"epoch": epoch, "train_loss": 1.0})
sink.close(timeout=120)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before": before, "after": after, "warnings": warnings}))
"""


@pytest.mark.timeout(400)
def test_a_tracker_answering_256_mib_costs_a_warning_and_no_memory(huge_tracker, tmp_path):
    environment = {
        **os.environ,
        "MLFLOW_TRACKING_URI": huge_tracker.url,
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    }
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, env=environment, timeout=360
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    grown_mib = (report["after"] - report["before"]) / 1024
    assert huge_tracker.requests, "the sink never asked the server"
    assert grown_mib < 64, f"peak RSS grew by {grown_mib:.0f} MiB reading a hostile tracker's answers"
    failures = [line for line in report["warnings"] if line.startswith("tracker mlflow: ")]
    assert failures and "training goes on" in failures[0], report["warnings"]
    assert f"over {8 << 20} bytes" in failures[0], failures[0]
    assert not (Path(tmp_path) / "tracker.json").exists()


def test_mlflow_credentials_for_a_plain_http_server_are_refused_at_start(digit_shards, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracker.example:5000/")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "secret-token-value")
    result = cli("train", "--shards", str(digit_shards), "--tracker", "mlflow", "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "MLFLOW_TRACKING_URI=http://tracker.example:5000" in lines[0], lines
    assert "MLFLOW_TRACKING_TOKEN" in lines[0] and "https is required" in lines[0], lines[0]
    assert "secret-token-value" not in result.stderr + result.stdout
    assert not (tmp_path / "run").exists()


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records the path and Authorization header of every request; `moved_to`: answer each with a 302 there."""

    moved_to = ""
    seen: list[tuple[str, str | None]]

    def _answer(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(302 if self.moved_to else 200)
        if self.moved_to:
            self.send_header("Location", self.moved_to + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def recording(moved_to: str = "") -> Iterator[type[_Recorder]]:
    """A recording server on 127.0.0.1 (redirecting to `moved_to`); its handler holds its URL and what it saw."""
    handler = type("Recorder", (_Recorder,), {"moved_to": moved_to, "seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    server.daemon_threads = True
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_tracker_that_redirects_a_request_with_credentials_is_not_followed(tmp_path):
    with recording() as elsewhere, recording(moved_to=elsewhere.url) as tracker:
        environment = {**os.environ, "MLFLOW_TRACKING_URI": tracker.url, "MLFLOW_TRACKING_TOKEN": "secret-token"}
        result = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, env=environment, timeout=300
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert tracker.seen and all(header == "Bearer secret-token" for _, header in tracker.seen)
    assert elsewhere.seen == [], f"a redirect was followed: {elsewhere.seen}"
    warnings = json.loads(result.stdout.strip().splitlines()[-1])["warnings"]
    assert any(line.startswith("tracker mlflow: ") and "302" in line for line in warnings), warnings
