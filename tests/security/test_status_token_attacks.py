"""The Trainer status client's bearer token never leaves for a host the Trainer did not name.

The status endpoint is hostile here: a real TLS server on 127.0.0.1 (its certificate signed by the CA the run is
given, as the Trainer's would be) that answers every POST with a redirect to a second server, plain http on
127.0.0.1, that records the Authorization header of anything it receives. urllib's default handler would resend
the token there; the client follows no redirect and says so in one warning naming the URL and the Location.
"""

from __future__ import annotations

import http.server
import logging
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from status_server import make_pki

from imagenet_train.ops.serve import free_port
from imagenet_train.training import progress

TOKEN = "eyJhbGciOiJSUzI1NiJ9.secret-token.signature"
SCHEDULE = SimpleNamespace(total=400, interval=200, epochs=2, global_batch=64)


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler], context: ssl.SSLContext | None = None) -> Iterator[str]:
    """`handler` served on a port of 127.0.0.1 (over TLS with `context`); yields its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    server.daemon_threads = True
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if context else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records the method, path and Authorization header of every request it receives."""

    seen: list[tuple[str, str, str | None]]

    def _record(self) -> None:
        self.seen.append((self.command, self.path, self.headers.get("Authorization")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = _record

    def log_message(self, *args):
        pass


class _Redirector(http.server.BaseHTTPRequestHandler):
    """Answers every POST with `code` and `location`, after reading the body."""

    code = 302
    location = ""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(self.code)
        self.send_header("Location", self.location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def recorder() -> Iterator[SimpleNamespace]:
    """The second server, plain http: its URL and what it received."""
    handler = type("Recorder", (_Recorder,), {"seen": []})
    with serving(handler) as url:
        yield SimpleNamespace(url=url, seen=handler.seen)


@pytest.fixture
def trainer(tmp_path) -> SimpleNamespace:
    """The CA and server certificate of the status endpoint, and the token file, as the Trainer mounts them."""
    ca, cert, key = make_pki(tmp_path / "trainer")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return SimpleNamespace(ca=str(ca), token=str(token), context=context)


def report_once(url: str, trainer: SimpleNamespace) -> progress.RunProgress:
    """Rank 0's progress for a run reporting to `url`, after it posted its final status (and waited for it)."""
    env = {
        "KUBEFLOW_TRAINER_SERVER_URL": url,
        "KUBEFLOW_TRAINER_SERVER_CA_CERT": trainer.ca,
        "KUBEFLOW_TRAINER_SERVER_TOKEN": trainer.token,
    }
    run = progress.RunProgress.of(SCHEDULE, True, env)
    run.report(10, force=True)
    run.end()
    return run


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_from_the_status_endpoint_never_carries_the_token_elsewhere(code, recorder, trainer, caplog):
    caplog.set_level(logging.WARNING)
    stolen = f"{recorder.url}/steal"
    handler = type("Redirector", (_Redirector,), {"code": code, "location": stolen})
    with serving(handler, trainer.context) as base:
        url = f"{base}/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/job/status"
        run = report_once(url, trainer)
    assert recorder.seen == [], f"the redirect was followed: {recorder.seen}"
    assert run.poster is not None and run.poster.sent == 0 and run.poster.failed >= 1
    warnings = [r.getMessage() for r in caplog.records if "cannot report progress" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert url in warnings[0] and stolen in warnings[0] and str(code) in warnings[0], warnings[0]
    assert TOKEN not in caplog.text


def test_a_plain_http_status_url_is_refused_at_start_saying_https_is_required(recorder, trainer, caplog):
    caplog.set_level(logging.WARNING)
    url = f"{recorder.url}/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/job/status"
    run = report_once(url, trainer)
    assert run.poster is None and recorder.seen == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "KUBEFLOW_TRAINER_SERVER_URL" in lines[0] and url in lines[0], lines
    assert "https is required" in lines[0], lines[0]
