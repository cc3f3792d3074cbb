"""A shard server that answers with redirects: it may not lead a run out of the index's folder.

The index and its server are the attacker's (a `http.server` on 127.0.0.1 that answers with redirects); the
other origin is a real nginx serving a shard the index never named. A refused redirect is one line naming the
URL and its target, exit 2; a redirect inside the folder is still followed.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import storage
from imagenet_train.io.resumable import describe
from imagenet_train.ops.serve import free_port

from .test_index_attacks import refused, two_sample_shard
from conftest import cli, write_index


class _Redirector(http.server.BaseHTTPRequestHandler):
    """Serves the files of `folder`, except for the paths in `moves`, which it answers with a 302 to the value."""

    folder: Path
    moves: dict[str, str] = {}

    def do_GET(self):
        if self.path in self.moves:
            self.send_response(302)
            self.send_header("Location", self.moves[self.path])
            self.end_headers()
            return
        path = self.folder / self.path.split("?")[0].lstrip("/").removeprefix("data/")
        if not self.path.startswith("/data/") or not path.is_file():
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(path.stat().st_size))
        self.end_headers()
        self.wfile.write(path.read_bytes())

    def log_message(self, *args):
        pass


@pytest.fixture
def redirector(tmp_path: Path) -> Iterator[tuple[str, type[_Redirector]]]:
    """A hostile server on 127.0.0.1: (its URL, its handler class, whose `moves` a test fills)."""
    folder = tmp_path / "redirector"
    folder.mkdir()
    handler = type("Handler", (_Redirector,), {"folder": folder, "moves": {}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_shard_redirected_to_another_origin_is_refused_naming_url_and_target(
    redirector, hostile_dir, hostile_server, tmp_path
):
    base, handler = redirector
    size = two_sample_shard(hostile_dir / "elsewhere.tar")  # the other origin's data, never named by the index
    write_index(handler.folder, [{"url": "x.tar", "nsamples": 2, "filesize": size}])
    target = f"{hostile_server.url}/elsewhere.tar"
    handler.moves["/data/x.tar"] = target
    index = f"{base}/data/shards.json"
    command = ["plan", "--shards", index, "--simulate", "--workers", "1", "--batch-size", "1"]
    line = refused(cli(*command, timeout=90), f"{base}/data/x.tar", target)
    assert "redirect" in line


@pytest.mark.parametrize(
    "location, reason",
    [
        ("http://localhost:{port}/data/y.tar", "another host"),  # the same server under another name
        ("ftp://127.0.0.1:{port}/data/y.tar", "another scheme"),
        ("file:///etc/passwd", "another scheme"),
        ("gopher://127.0.0.1:1/x", "another scheme"),
        ("/other/y.tar", "outside the folder"),
        ("/data/%2e%2e/other/y.tar", "climbs out"),
        ("/data/x.tar", "more than 5 redirects"),  # a loop
    ],
)
def test_a_redirect_out_of_the_folder_or_a_loop_is_one_line_naming_url_and_target(redirector, location, reason):
    base, handler = redirector
    port = base.rsplit(":", 1)[1]
    (handler.folder / "y.tar").write_bytes(b"y" * 1024)
    handler.moves["/data/x.tar"] = location.format(port=port)
    with pytest.raises(ImagenetTrainError) as caught:
        storage.read_bytes(f"{base}/data/x.tar", io_timeout=2)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{base}/data/x.tar: "), message
    assert reason in message and location.format(port=port).rsplit("/", 1)[-1] in message, message


def test_a_redirect_loop_between_two_names_ends_after_the_bound(redirector):
    base, handler = redirector
    handler.moves.update({"/data/a.tar": "/data/b.tar", "/data/b.tar": "/data/a.tar"})
    with pytest.raises(ImagenetTrainError, match="more than 5 redirects"):
        storage.read_bytes(f"{base}/data/a.tar", io_timeout=2)


def test_a_redirect_within_the_folder_is_followed_for_the_index_and_its_shards(redirector):
    base, handler = redirector
    (handler.folder / "sub").mkdir()
    size = two_sample_shard(handler.folder / "sub" / "x.tar")
    write_index(handler.folder / "sub", [{"url": "x.tar", "nsamples": 2, "filesize": size}])
    handler.moves["/data/shards.json"] = "/data/sub/shards.json"  # the sub/ index lists x.tar beside itself
    handler.moves["/data/sub/x.tar"] = f"{base}/data/sub/moved.tar?v=2"  # absolute, then relative
    handler.moves["/data/sub/moved.tar?v=2"] = "x.real"
    (handler.folder / "sub" / "x.real").write_bytes((handler.folder / "sub" / "x.tar").read_bytes())
    assert b'"x.tar"' in storage.read_bytes(f"{base}/data/shards.json")
    with storage.open_stream(f"{base}/data/sub/x.tar") as stream:
        assert stream.read() == (handler.folder / "sub" / "x.tar").read_bytes()


def test_an_error_whose_reason_is_empty_is_described_by_its_kind():
    class Empty(OSError):
        reason = EOFError()

    assert describe(Empty()) == "EOFError"
