"""Opening shard URLs: HTTP from nginx, retries, resuming a dropped stream, and clear errors."""

import http.server
import os
import subprocess
import sys
import threading
import time

import pytest

from imagenet_train.errors import ImagenetTrainError, clip
from imagenet_train.io import pipe, storage
from imagenet_train.io.pipe import CommandFailed
from imagenet_train.ops.serve import free_port

from conftest import as_pid_1, needs_pid_namespace


def test_http_read_from_nginx_is_byte_identical(shard_server, digit_shards):
    name = sorted(p.name for p in digit_shards.glob("*.tar"))[0]
    with storage.open_stream(f"{shard_server.url}/{name}") as stream:
        assert stream.read() == (digit_shards / name).read_bytes()


def test_missing_object_is_a_one_line_error_naming_the_url(shard_server):
    url = f"{shard_server.url}/no-such-shard.tar"
    with pytest.raises(ImagenetTrainError, match="HTTP 404") as caught:
        storage.open_stream(url)
    assert url in str(caught.value)


def test_unreachable_server_fails_after_the_io_budget_not_a_hang():
    url = f"http://127.0.0.1:{free_port()}/x.tar"
    started = time.monotonic()
    with pytest.raises(ImagenetTrainError, match="unreachable for [0-9]+ s .Connection refused"):
        storage.open_stream(url, io_timeout=2)
    assert time.monotonic() - started < 10  # the budget bounds the wait (2 s, plus one capped backoff)


class _DroppingHandler(http.server.BaseHTTPRequestHandler):
    """Serves `payload`, cutting the first response short so the client must resume with Range."""

    payload = bytes(range(256)) * 4096
    requests: list = []

    def do_GET(self):
        start = 0
        if "Range" in self.headers:
            start = int(self.headers["Range"].split("=")[1].rstrip("-"))
        type(self).requests.append(start)
        body = self.payload[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if len(type(self).requests) == 1:
            self.wfile.write(body[: len(body) // 3])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_dropped_http_stream_resumes_with_a_range_request():
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _DroppingHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with storage.open_stream(f"http://127.0.0.1:{port}/x.tar", io_timeout=30) as stream:
            data = stream.read()
    finally:
        server.shutdown()
    assert data == _DroppingHandler.payload
    assert _DroppingHandler.requests[0] == 0 and _DroppingHandler.requests[1] > 0


def test_local_paths_and_file_urls_resolve_relative_names(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"abc")
    assert storage.read_bytes(f"file://{tmp_path}/a.tar") == b"abc"
    assert storage.join("http://h:1/data", "a.tar") == "http://h:1/data/a.tar"
    assert storage.join(str(tmp_path), "a.tar") == str(tmp_path / "a.tar")
    assert storage.join("http://h:1/data", "sub/../b.tar") == "http://h:1/data/sub/../b.tar"  # stays inside
    assert storage.join("http://h:1/data", "http://other/b.tar", trusted=True) == "http://other/b.tar"
    with pytest.raises(ImagenetTrainError, match="cannot open"):
        storage.open_stream(str(tmp_path / "missing.tar"))


@pytest.mark.parametrize(
    "name",
    [
        "http://other/b.tar",
        "pipe:cat b.tar",
        "file:///etc/passwd",
        "/etc/passwd",
        "../b.tar",
        "a/../../b.tar",
        "%2e%2e/b.tar",
        "%2fetc/passwd",
        "gs://other/b.tar",
        "",
        "a\nb.tar",
    ],
)
def test_names_outside_the_base_folder_are_refused_unless_trusted(name):
    with pytest.raises(ImagenetTrainError, match="expected a name inside http://h:1/data"):
        storage.join("http://h:1/data", name)


class _AISProxy(http.server.BaseHTTPRequestHandler):
    """An AIStore proxy stand-in: the object API path, answered with a redirect to a target."""

    target = ""
    paths: list = []

    def do_GET(self):
        type(self).paths.append(self.path)
        if self.path.startswith("/v1/objects/"):
            self.send_response(307)
            self.send_header("Location", f"{self.target}{self.path}")
            self.end_headers()
            return
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_ais_urls_use_the_object_api_and_follow_the_redirect_to_a_target(digit_shards, tmp_path, monkeypatch):
    from imagenet_train.ops.serve import NginxServer

    name = sorted(p.name for p in digit_shards.glob("*.tar"))[0]
    # A real nginx plays the AIS target, serving /v1/objects/<bucket>/<object> from a folder of that shape.
    target_root = tmp_path / "target"
    (target_root / "v1" / "objects" / "shards").mkdir(parents=True)
    (target_root / "v1" / "objects" / "shards" / name).write_bytes((digit_shards / name).read_bytes())
    port = free_port()
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", port), _AISProxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    monkeypatch.setenv("AIS_ENDPOINT", f"http://127.0.0.1:{port}")
    try:
        with NginxServer(str(target_root)) as target:
            _AISProxy.target = target.url
            with storage.open_stream(f"ais://shards/{name}") as stream:
                assert stream.read() == (digit_shards / name).read_bytes()
    finally:
        proxy.shutdown()
    assert _AISProxy.paths[-1] == f"/v1/objects/shards/{name}?provider=ais"


def test_ais_needs_an_endpoint(monkeypatch):
    monkeypatch.delenv("AIS_ENDPOINT", raising=False)
    with pytest.raises(ImagenetTrainError, match="set AIS_ENDPOINT"):
        storage.open_stream("ais://bucket/x.tar")


class _FlakyThenGood(http.server.BaseHTTPRequestHandler):
    payload = bytes(range(256)) * 64

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.payload)))
        self.end_headers()
        self.wfile.write(self.payload)

    def log_message(self, *args):
        pass


def test_an_outage_shorter_than_the_io_budget_is_waited_out_and_logged(caplog):
    """Nothing listens for ~3 s, then the server appears on the same port: the open succeeds, one wait line."""
    port = free_port()
    holder: dict = {}

    def start_later():
        time.sleep(3)
        holder["server"] = http.server.ThreadingHTTPServer(("127.0.0.1", port), _FlakyThenGood)
        holder["server"].serve_forever()

    threading.Thread(target=start_later, daemon=True).start()
    try:
        with storage.open_stream(f"http://127.0.0.1:{port}/x.tar", io_timeout=60) as stream:
            assert stream.read() == _FlakyThenGood.payload
    finally:
        holder["server"].shutdown()
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]
    assert len(waits) <= 1  # at most one line per minute per node, however many attempts
    assert not waits or "Connection refused" in waits[0] and "of --io-timeout 60 s" in waits[0]


def _group_gone(pgid: int, within: float = 5.0) -> bool:
    """Whether no process of group `pgid` is left within `within` s (a killed one is reaped by init)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_pipe_command_is_read_as_the_shard(digit_shards):
    shard = sorted(digit_shards.glob("*.tar"))[0]
    with storage.open_stream(f"pipe:cat {shard}") as stream:
        assert stream.read() == shard.read_bytes()


@pytest.mark.parametrize(
    ("command", "reason"),
    [("cat {shard}; exit 3", "the command exited with status 3"), ("kill -9 $$", "the command was killed by SIGKILL")],
)
def test_a_pipe_command_that_fails_is_an_error_naming_it_at_the_end_of_its_output(digit_shards, command, reason):
    shard = sorted(digit_shards.glob("*.tar"))[0]
    location = "pipe:" + command.format(shard=shard)
    with storage.open_stream(location) as stream, pytest.raises(CommandFailed) as caught:
        stream.read()
    assert str(caught.value) == f"{clip(location)}: {reason}" and caught.value.reason == reason


def test_a_pipe_closed_while_its_command_writes_ends_it_by_sigpipe_at_once(monkeypatch):
    monkeypatch.setattr(pipe, "CLOSE_WAIT_S", 60.0)  # not the kill after the wait: SIGPIPE ends it
    stream = storage.open_stream("pipe:yes")
    assert stream.read(4) == b"y\ny\n"
    group, started = stream.raw.process.pid, time.monotonic()
    stream.close()
    assert time.monotonic() - started < 5 and _group_gone(group)


def test_a_pipe_closed_before_its_end_kills_a_command_that_writes_no_more(digit_shards, monkeypatch):
    monkeypatch.setattr(pipe, "CLOSE_WAIT_S", 1.0)
    shard = sorted(digit_shards.glob("*.tar"))[0]
    stream = storage.open_stream(f"pipe:cat {shard}; sleep 600")
    assert stream.read(512) == shard.read_bytes()[:512]
    group, started = stream.raw.process.pid, time.monotonic()
    stream.close()
    assert time.monotonic() - started < 5 and _group_gone(group)


def test_a_pipe_command_that_failed_past_what_was_read_is_a_warning_at_close(caplog):
    stream = storage.open_stream("pipe:printf tar; exit 3")
    assert stream.read(1) == b"t"
    while stream.raw.process.poll() is None:
        time.sleep(0.01)
    stream.close()
    assert [r.getMessage() for r in caplog.records] == [
        "pipe:printf tar; exit 3: the command exited with status 3 past what was read of it"
    ]


def test_a_pipe_command_that_runs_on_after_its_output_ended_is_cut_off(monkeypatch):
    monkeypatch.setattr(pipe, "EXIT_WAIT_S", 1.0)
    stream = storage.open_stream("pipe:printf tar; exec >&-; sleep 600")
    group = stream.raw.process.pid
    with stream, pytest.raises(CommandFailed, match="the command still ran 1 s after its output ended"):
        stream.read()
    assert _group_gone(group)


def test_a_pipe_command_dies_with_the_process_that_reads_it_even_one_that_writes_nothing():
    """A loader worker killed outright (OOM killer, SIGKILL) cannot close its streams; a command that writes
    nothing more (a stalled download) would never meet the SIGPIPE that ends the others."""
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, "pipe:printf x; sleep 600 | cat"], stdout=subprocess.PIPE, text=True
    )
    group = int(reader.stdout.readline())
    assert reader.stdout.readline() == "read x\n"  # the command runs, and has written all it will write
    reader.kill()
    reader.wait()
    assert _group_gone(group), _processes_of(group)


def _processes_of(pgid: int) -> list[str]:
    listed = subprocess.run(["ps", "-e", "-o", "pgid=,pid=,stat=,args="], capture_output=True, text=True).stdout
    return [line for line in listed.splitlines() if line.split()[0] == str(pgid)]


@needs_pid_namespace
def test_pipe_commands_ended_any_way_leave_no_zombie_to_a_reader_that_is_pid_1():
    """A rank as its container's pid 1 (an image without an init) reaps what is left to it: a command read to its
    end or closed early is reaped by its own shell, one killed (closed early or run on past its output) with its
    whole group by the reader."""
    script = (
        "import contextlib, glob, os\n"
        "from imagenet_train.io import pipe, storage\n"
        "assert os.getpid() == 1\n"
        "pipe.CLOSE_WAIT_S = pipe.EXIT_WAIT_S = 0.5\n"
        "for _ in range(3):\n"
        "    with storage.open_stream('pipe:printf abc') as stream:\n"
        "        assert stream.read() == b'abc'\n"
        "    with storage.open_stream('pipe:yes') as stream:\n"
        "        stream.read(10)\n"
        "    with storage.open_stream('pipe:printf x; sleep 600 | cat') as stream:\n"
        "        stream.read(1)\n"
        "    with contextlib.suppress(pipe.CommandFailed), storage.open_stream('pipe:exec >&-; sleep 600') as stream:\n"
        "        stream.read()\n"
        "states = [open(p).read().rsplit(')', 1)[1].split()[0] for p in glob.glob('/proc/[0-9]*/stat')]\n"
        "print(len(states), states.count('Z'))\n"
    )
    result = as_pid_1(script, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["1", "0"]  # the reader alone, and no zombie


_READER = """
import sys
from imagenet_train.io import storage
stream = storage.open_stream(sys.argv[1])
print(stream.raw.process.pid, flush=True)
print("read", stream.read(1).decode(), flush=True)
stream.read()
"""
