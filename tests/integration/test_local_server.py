"""tools/local_server.py: a server process started and polled until it answers (the tests' emulators, the
dashboard's Prometheus and the peers bench's S3 server all start theirs with it)."""

import http.server
import os
import subprocess
import sys
import threading
import time

import pytest
from local_server import NoAnswer, answers, serving

from imagenet_train.ops.serve import free_port


def test_a_server_that_answers_is_handed_over_running_and_stopped_on_leaving(tmp_path):
    (tmp_path / "ready").write_text("yes")
    port = free_port()
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    with serving(command, f"http://127.0.0.1:{port}/ready", 30) as process:
        assert process.poll() is None and answers(f"http://127.0.0.1:{port}/ready")
    assert process.poll() is not None and not answers(f"http://127.0.0.1:{port}/ready")


def test_a_server_that_exits_before_answering_is_named_at_once():
    started = time.monotonic()
    command = [sys.executable, "-c", "raise SystemExit(3)"]
    with (
        pytest.raises(NoAnswer, match=r"exited \(3\) before http://127\.0\.0\.1:\d+/ answered"),
        serving(command, f"http://127.0.0.1:{free_port()}/", 60),
    ):
        pytest.fail("handed over a server that never answered")
    assert time.monotonic() - started < 30


def test_a_server_that_never_answers_is_given_up_after_its_time_and_stopped(tmp_path):
    marker = f"never-answers-{os.getpid()}-{tmp_path.name}"
    command = [sys.executable, "-c", f"import time; time.sleep(120)  # {marker}"]
    with (
        pytest.raises(NoAnswer, match=r"did not answer within 1 s"),
        serving(command, f"http://127.0.0.1:{free_port()}/", 1),
    ):
        pytest.fail("handed over a server that never answered")
    stray = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert stray.stdout.strip() == "", stray.stdout


class _Status(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(int(self.path.strip("/")))
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_404_is_a_server_that_is_up_and_a_503_one_that_is_not_ready():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Status)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert [answers(f"{base}/{status}") for status in (200, 404, 503)] == [True, True, False]
    finally:
        server.shutdown()
        server.server_close()
