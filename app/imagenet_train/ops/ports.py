"""Whether a TCP port is taken, and by which process: read from the kernel's socket tables under /proc."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

LISTEN = "0A"  # the TCP state /proc/net/tcp shows for a listening socket


def port_taken(host: str, port: int) -> bool:
    """Whether binding host:port fails as nginx's bind would (address in use), tried with nginx's SO_REUSEADDR."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


def listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on `port` at any address (IPv4 and IPv6), from /proc/net/tcp{,6}."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def port_holder(port: int) -> str | None:
    """'pid N (name)' of a process listening on `port`, or None where /proc does not say (another user's process)."""
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port)}
    if not wanted:
        return None
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _holds(entry, wanted):
            try:
                name = (entry / "comm").read_text().strip()
            except OSError:
                name = "?"
            return f"pid {entry.name} ({name})"
    return None


def _holds(process: Path, sockets: set[str]) -> bool:
    try:
        descriptors = list((process / "fd").iterdir())
    except OSError:  # gone, or another user's
        return False
    for descriptor in descriptors:
        try:
            if os.readlink(descriptor) in sockets:
                return True
        except OSError:
            continue
    return False
