"""The harness cleans up after this host's sessions that were killed: their pods would go on training and their
networks would keep a subnet. Real podman objects; a dead session's pid comes from a process that has exited;
another host's objects are left alone."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import imagebuild

from .cluster import OWNER, owner, sweep_abandoned


def labelled(engine: imagebuild.Podman, *listing: str) -> dict[str, str]:
    """Name -> owner pid of what carries the owner label."""
    found = json.loads(engine(*listing, "--filter", f"label={OWNER}", "--format", "json").stdout or "[]")
    names = {}
    for item in found:
        name = item.get("Name") or item.get("name") or item["Names"][0]
        names[name] = (item.get("Labels") or item.get("labels") or {})[OWNER]
    return names


def test_what_a_dead_session_left_is_removed_and_a_running_ones_is_kept(tmp_path):
    engine = imagebuild.Podman(tmp_path / "podman")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    dead, alive, elsewhere = f"{host}:{gone.stdout.strip()}", owner(), f"another-host:{gone.stdout.strip()}"
    names = {who: f"sweep-test-{n}" for n, who in enumerate((dead, alive, elsewhere))}
    try:
        for who, name in names.items():
            label = ["--label", f"{OWNER}={who}"]
            engine("network", "create", *label, name)
            engine("volume", "create", *label, name)
            engine("pod", "create", *label, "--name", name, "--network", name)  # with its infra container
        removed = sweep_abandoned(engine)
        left = {kind: labelled(engine, *kind) for kind in [("network", "ls"), ("volume", "ls"), ("pod", "ps")]}
        containers = labelled(engine, "ps", "--all")
    finally:
        for name in names.values():
            engine("pod", "rm", "-f", name, check=False)
            engine("volume", "rm", "--force", name, check=False)
            engine("network", "rm", name, check=False)
    assert names[dead] in removed
    for kind, found in left.items():
        assert found.get(names[alive]) == alive and found.get(names[elsewhere]) == elsewhere, (kind, found)
        assert names[dead] not in found, (kind, found)
    assert dead not in containers.values() and {alive, elsewhere} <= set(containers.values()), containers
