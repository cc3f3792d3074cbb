"""A server process started on loopback and polled until it answers: the one start-and-poll loop that the tests'
emulators (tests/conftest.py's local_service), the dashboard's Prometheus (tools/dashboard_png.py) and the peers
bench's S3 server (bench/peers.py) share. Operator and test code: the package never imports tools/."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO


class NoAnswer(RuntimeError):
    """The server exited, or did not answer within its time."""


def adjacent_ports() -> int:
    """A port P with P and P + 1 both free on 127.0.0.1 (two local ranks' metrics ports)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port == 65535:
            continue
        with contextlib.suppress(OSError), socket.socket() as second:
            second.bind(("127.0.0.1", port + 1))
            return port
    raise RuntimeError("no two adjacent free ports on 127.0.0.1")


def answers(url: str, timeout: float = 2) -> bool:
    """Whether `url` answers with a status below 500: a 404 is a server that is up, a 503 one that is not ready."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError as error:
        return error.code < 500
    except OSError:
        return False


@contextlib.contextmanager
def serving(
    command: Sequence[str], probe_url: str, seconds: float, log: IO | int = subprocess.DEVNULL
) -> Iterator[subprocess.Popen]:
    """`command` running, its output to `log`, once `probe_url` answers; NoAnswer naming both when it exits first
    or `seconds` pass. Stopped (terminated, then killed) on leaving."""
    process = subprocess.Popen(list(command), stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + seconds
        while not answers(probe_url):
            if process.poll() is not None:
                raise NoAnswer(f"{Path(command[0]).name} exited ({process.returncode}) before {probe_url} answered")
            if time.monotonic() > deadline:
                raise NoAnswer(f"{Path(command[0]).name}: {probe_url} did not answer within {seconds:.0f} s")
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
