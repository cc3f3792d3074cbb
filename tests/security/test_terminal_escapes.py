"""Untrusted text on its way to a terminal: a server's reason phrase and a tar member name carry escape sequences.

An OSC sequence retitles the terminal, a CSI one clears it, a carriage return moves back over the URL that the
line starts with. The hostile server is a real `http.server` on 127.0.0.1; the shards are real tar files. The
printed line holds no raw control character (errors.visible makes them `\\x1b`-style escapes) and still names
the URL.
"""

from __future__ import annotations

import http.server
import io
import logging
import multiprocessing
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagenet_train.loading.stages import DamageCounters, decoded, read_shards
from imagenet_train.ops.serve import free_port

from conftest import cli, write_index

# Retitle the terminal (OSC 0), clear the screen (CSI 2J), go back to the line's start and overwrite it.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[H\rall is well \u202eexe"
RAW = ("\x1b", "\x07", "\r", "\u202e", "\x9b")


def shows_no_controls(text: str) -> bool:
    """Whether `text` holds none of the hostile sequence's raw control characters."""
    return not any(character in text for character in RAW)


class _Hostile(http.server.BaseHTTPRequestHandler):
    code = 404

    def do_GET(self):
        self.send_response(self.code, HOSTILE.replace("\u202e", "\x9b"))  # a reason phrase is latin-1: C1 CSI
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hostile_reasons() -> Iterator[type[_Hostile]]:
    """A server on 127.0.0.1 that answers every GET with `code` and an escape-laden reason phrase."""
    handler = type("Handler", (_Hostile,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("code", [404, 503])
def test_a_reason_phrase_with_escape_sequences_is_printed_escaped_and_the_line_names_the_url(hostile_reasons, code):
    hostile_reasons.code = code  # 404: refused at once; 503: an outage, its reason in the 'unreachable' line
    url = f"{hostile_reasons.url}/data/shards.json"
    result = cli("probe", url, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("imagenet-train: error: "), result.stderr[-2000:]
    assert shows_no_controls(result.stderr + result.stdout), repr(result.stderr)
    assert url in lines[0] and f"HTTP {code}" in lines[0] and "\\x1b]0;pwned" in lines[0], lines[0]


def escaped_member_shard(path: Path) -> str:
    """A shard whose second sample's member name holds the hostile sequence, cut short inside that member."""
    name = "\x1b]0;pwned\x07\x1b[2J\rkey.jpg"
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for member, data in (("000000.cls", b"0"), (name, b"x" * 4096)):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(out.getvalue()[: 512 * 3 + 1000])  # the .cls, then the hostile header and part of its data
    return name


def test_a_member_name_with_escape_sequences_is_printed_escaped_by_probe(tmp_path):
    shard = tmp_path / "x.tar"
    escaped_member_shard(shard)
    index = write_index(tmp_path, [{"url": "x.tar", "nsamples": 1, "filesize": shard.stat().st_size}])
    result = cli("probe", str(index), timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "truncated member" in lines[0], result.stderr[-2000:]
    assert shows_no_controls(result.stderr), repr(result.stderr)
    assert str(shard) in lines[0] and "\\x1b]0;pwned" in lines[0], lines[0]


def test_a_key_with_escape_sequences_reaches_the_loaders_warnings_escaped(tmp_path, caplog):
    shard = tmp_path / "x.tar"
    out = io.BytesIO()
    members = ((f"{HOSTILE}.cls", b"not a class"), (f"{HOSTILE}.jpg", b"\xff\xd8"), (f"{HOSTILE}2.cls", b"12"))
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for member, data in members:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    shard.write_bytes(out.getvalue()[: 512 * 5 + 1])  # a corrupt sample, then a member cut short
    counters = DamageCounters(multiprocessing.get_context("spawn"))
    with caplog.at_level(logging.WARNING):
        list(decoded(read_shards([str(shard)]), lambda data: data, counters, max_streak=0))
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("skipping corrupt sample" in line for line in warnings), warnings
    assert any("broken shard" in line and "truncated member" in line for line in warnings), warnings
    assert all(shows_no_controls(line) and str(shard) in line for line in warnings), warnings
    assert all("\\x1b]0;pwned" in line for line in warnings), warnings


def test_visible_escapes_every_control_a_terminal_acts_on_and_keeps_printable_text():
    from imagenet_train.errors import visible  # here: the attacks above also run against a tree without it

    assert visible("ünïcode text, 中文") == "ünïcode text, 中文"
    shown = visible("a\x1b[2Jb\x07c\rd\ne\x7ff\x9bg\u202eh\u2028i\udcffj")
    assert shown == "a\\x1b[2Jb\\x07c\\rd\\ne\\x7ff\\x9bg\\u202eh\\u2028i\\udcffj"
