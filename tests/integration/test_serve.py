"""`imagenet-train serve`: a real nginx with its own config and prefix, reachable, stopped by its pid."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

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


def test_health_checks_are_answered_from_memory_even_with_an_empty_volume(tmp_path):
    """The chart's probes hit /healthz: a constant answer, no directory listing, whatever the volume holds."""
    empty = tmp_path / "volume"
    empty.mkdir()
    with NginxServer(str(empty)) as server, urllib.request.urlopen(f"{server.url}/healthz", timeout=10) as answer:
        assert answer.status == 200 and answer.read() == b"ok\n"
