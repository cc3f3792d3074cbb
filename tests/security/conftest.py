"""Fixtures of the attack tests: a hostile directory served by a real nginx on 127.0.0.1, and the marker
files an attack would leave if it ran code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from imagenet_train.ops.serve import NginxServer


@pytest.fixture
def hostile_dir(tmp_path: Path) -> Path:
    """A folder the attacker controls: whatever a test writes here is served by `hostile_server`."""
    folder = tmp_path / "hostile"
    folder.mkdir()
    return folder


@pytest.fixture
def hostile_server(hostile_dir: Path) -> Iterator[NginxServer]:
    """A real nginx on 127.0.0.1 serving the attacker's folder (an index, shards, anything)."""
    with NginxServer(str(hostile_dir)) as server:
        yield server


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    """Where a successful attack would leave its mark; every test asserts it does not exist."""
    return tmp_path / "ATTACK-RAN"
