"""`imagenet-train serve`: a real nginx with its own config and prefix, reachable, stopped by its pid."""

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.ops.serve import NginxServer, free_port


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_serve_command_serves_index_listing_and_shards_then_stops(digit_shards):
    port = free_port()
    executable = Path(sys.executable).with_name("imagenet-train")
    process = subprocess.Popen(
        [str(executable), "serve", str(digit_shards), "--port", str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        banner = process.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in banner
        nginx_pid = int(banner.split("nginx pid ")[1].split(")")[0])
        base = f"http://127.0.0.1:{port}"
        index = json.load(urllib.request.urlopen(f"{base}/shards.json"))
        listing = json.load(urllib.request.urlopen(f"{base}/"))  # autoindex_format json
        assert {entry["name"] for entry in listing} >= {"shards.json", index["shardlist"][0]["url"]}
        shard = urllib.request.urlopen(f"{base}/{index['shardlist'][0]['url']}").read()
        assert len(shard) == index["shardlist"][0]["filesize"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
    deadline = time.monotonic() + 10
    while _alive(nginx_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(nginx_pid)


def test_server_serves_ranges_and_cleans_up_its_state_dir(digit_shards):
    with NginxServer(str(digit_shards)) as server:
        state = server.state
        name = sorted(p.name for p in digit_shards.glob("*.tar"))[0]
        request = urllib.request.Request(f"{server.url}/{name}", headers={"Range": "bytes=100-199"})
        response = urllib.request.urlopen(request)
        assert response.status == 206
        assert response.read() == (digit_shards / name).read_bytes()[100:200]
        assert (state / "nginx.conf").read_text().count(f"listen 127.0.0.1:{server.port};") == 1
    assert not state.exists()


def test_a_stopped_server_starts_again_on_its_own_port_at_once(digit_shards):
    """What the outage tests and the dashboard's run do: stop nginx while clients hold connections, then start it
    again on the same port straight away (through TIME_WAIT)."""
    server = NginxServer(str(digit_shards)).start()
    try:
        name = sorted(p.name for p in digit_shards.glob("*.tar"))[0]
        with urllib.request.urlopen(f"{server.url}/{name}") as response:
            response.read(1)
            port = server.port
            server.stop()
        assert server.start_again(10) is server and server.port == port
        with urllib.request.urlopen(f"{server.url}/{name}") as response:
            assert response.status == 200
    finally:
        server.stop()


def test_health_checks_are_answered_from_memory_even_with_an_empty_volume(tmp_path):
    """The chart's probes hit /healthz: a constant answer, no directory listing, whatever the volume holds."""
    empty = tmp_path / "volume"
    empty.mkdir()
    with NginxServer(str(empty)) as server, urllib.request.urlopen(f"{server.url}/healthz", timeout=10) as answer:
        assert answer.status == 200 and answer.read() == b"ok\n"


class OtherServer:
    """Another HTTP server holding a port first (answering with its own index), run in this test's process."""

    def __init__(self) -> None:
        handler = type(
            "Handler", (http.server.BaseHTTPRequestHandler,), {"do_GET": _answer_other, "log_message": _quiet}
        )
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _answer_other(handler) -> None:
    handler.send_response(200)
    handler.end_headers()
    handler.wfile.write(b"the other server\n")


def _quiet(*_) -> None:
    pass


def test_serve_on_a_port_another_server_holds_is_refused_in_one_line_naming_it(digit_shards):
    other = OtherServer()
    executable = Path(sys.executable).with_name("imagenet-train")
    try:
        started = time.monotonic()
        result = subprocess.run(
            [str(executable), "serve", str(digit_shards), "--port", str(other.port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
        assert urllib.request.urlopen(f"http://127.0.0.1:{other.port}/").read() == b"the other server\n"
    finally:
        other.close()
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "serving" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"127.0.0.1:{other.port}: already in use by pid {os.getpid()}" in lines[0], lines[0]
    assert "--port" in lines[0] and took < 60


def test_a_server_that_takes_the_port_after_the_check_is_not_mistaken_for_nginx(digit_shards, monkeypatch):
    """The check before nginx starts can lose a race; the start-up probe then hears the other server, whose
    answer lacks this nginx's token, and nginx's own failed bind ends it in the same one line."""
    other = OtherServer()
    monkeypatch.setattr("imagenet_train.ops.serve.port_taken", lambda host, port: False)
    try:
        server = NginxServer(str(digit_shards), port=other.port)
        with pytest.raises(ImagenetTrainError, match=f"127.0.0.1:{other.port}: already in use by pid {os.getpid()}"):
            server.start(timeout=30)
        server.stop()
    finally:
        other.close()
