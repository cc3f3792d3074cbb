"""Fault injectors for the fault suite: real parts broken for real (servers stopped and restarted on the
same port, shards damaged on disk, a small filesystem, a slow and lossy link inside a network namespace).

Every injector is a context manager or a function that undoes itself; the netns, veth, tmpfs and
firewall changes live only inside namespaces and mounts created here and are removed in `finally`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from imagenet_train.ops.serve import NginxServer


# -- data: a small copy of the digit shards, and damaged copies -----------------------------------------
def subset_shards(source: Path, dest: Path, train: int = 4, val: int = 1) -> Path:
    """Copy the first `train` train shards and `val` val shards of an index into `dest` with their own index."""
    document = json.loads((source / "shards.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("val", val)):
        kept = document["splits"][split]["shardlist"][:count]
        document["splits"][split]["shardlist"] = kept
        for shard in kept:
            shutil.copy2(source / shard["url"], dest / shard["url"])
    document["shardlist"] = document["splits"]["train"]["shardlist"]
    names = {s["url"] for split in document["splits"].values() for s in split["shardlist"]}
    document["entries"] = [e for e in document.get("entries", []) if not isinstance(e, dict) or e.get("url") in names]
    (dest / "shards.json").write_text(json.dumps(document, indent=1))
    return dest


def shard_keys(shard: Path) -> list[str]:
    """Sample keys of a shard in tar order (WebDataset's rule: the member name up to its first dot)."""
    keys: list[str] = []
    with tarfile.open(shard) as archive:
        for member in archive.getmembers():
            folder, _, name = member.name.rpartition("/")
            key = (folder + "/" if folder else "") + name.split(".", 1)[0]
            if not keys or keys[-1] != key:
                keys.append(key)
    return keys


def train_keys(shards: Path) -> set[str]:
    """Every training sample key of an index's shards, read from the tar files themselves."""
    document = json.loads((shards / "shards.json").read_text())
    return {key for shard in document["splits"]["train"]["shardlist"] for key in shard_keys(shards / shard["url"])}


def truncate_shard(shard: Path, keep_samples: int) -> list[str]:
    """Cut a shard in the middle of the member after the first `keep_samples` samples; returns the cut-off keys.

    The cut lands inside a JPEG's data, so a reader sees a header whose member runs past the end of the file.
    """
    keys = shard_keys(shard)
    with tarfile.open(shard) as archive:
        members = archive.getmembers()
    first_lost = keys[keep_samples]
    victim = next(m for m in members if m.name.startswith(first_lost + ".") and m.size > 100)
    cut = victim.offset_data + victim.size // 2
    with open(shard, "r+b") as stream:
        stream.truncate(cut)
    return keys[keep_samples:]


def corrupt_jpeg_in_shard(shard: Path, sample: int) -> str:
    """Overwrite the JPEG bytes of one sample with garbage of the same length (the tar stays valid); its key."""
    key = shard_keys(shard)[sample]
    with tarfile.open(shard) as archive:
        member = next(m for m in archive.getmembers() if m.name.startswith(key + ".") and m.name.endswith(".jpg"))
    with open(shard, "r+b") as stream:
        stream.seek(member.offset_data)
        stream.write(b"\x00not a jpeg\xff" * (member.size // 12) + b"\x00" * (member.size % 12))
    return key


# -- nginx: stopped by its pid and started again on the same port ---------------------------------------
class RestartableNginx(NginxServer):
    """A real nginx that can be taken down and brought back on the same host:port (its state dir is new)."""

    def down(self) -> None:
        """Stop nginx (SIGTERM to its master, as an operator or a node failure would)."""
        self.stop()

    def up(self, timeout: float = 20.0) -> None:
        """Start nginx again on the same port (NginxServer.start_again: through TIME_WAIT)."""
        self.start_again(timeout)


def timed_outage(down, up, seconds: float) -> dict:
    """Take a service down, keep it down `seconds`, bring it back; returns when it went down and came back."""
    started = time.monotonic()
    down()
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    up()
    return {"down_at": started, "up_at": time.monotonic(), "down_s": time.monotonic() - started}


# -- the GCS emulator with on-disk storage, stopped and restarted with its data ------------------------
class RestartableEmulator:
    """gcp-storage-emulator on 127.0.0.1:port storing objects under `data_dir`, so a restart keeps them."""

    def __init__(self, data_dir: Path, port: int, bucket: str):
        self.data_dir, self.port, self.bucket = data_dir, port, bucket
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self, timeout: float = 30.0) -> None:
        """Start the emulator (with on-disk storage rooted at data_dir) and wait until it answers."""
        executable = str(Path(sys.executable).with_name("gcp-storage-emulator"))
        command = [executable, "start", "--host", "127.0.0.1", "--port", str(self.port), "-q"]
        if not (self.data_dir / ".cloudstorage").exists():
            command += ["--default-bucket", self.bucket]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "STORAGE_BASE": str(self.data_dir), "STORAGE_DIR": ".cloudstorage"}
        self.process = subprocess.Popen(
            command, cwd=self.data_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.down()
                    pytest.fail("gcp-storage-emulator did not start")
                time.sleep(0.2)

    def down(self) -> None:
        """Stop the emulator process by its pid."""
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


# -- a small filesystem that fills up -----------------------------------------------------------------
def need_root(what: str) -> None:
    """Skip the test (with the reason) unless we are root, which mounts and namespaces need."""
    if os.geteuid() != 0:
        pytest.skip(f"{what}: needs root (mount/netns); not root here")


@contextlib.contextmanager
def small_tmpfs(path: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb` MiB mounted at `path` (grown later with `grow_tmpfs`); unmounted afterwards."""
    need_root("tmpfs")
    path.mkdir(parents=True, exist_ok=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)]
    mounted = subprocess.run(command, capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"tmpfs: cannot mount ({mounted.stderr.decode().strip()})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def grow_tmpfs(path: Path, size_mb: int) -> None:
    """Give the mounted tmpfs more room (remount with a larger size=)."""
    subprocess.run(["mount", "-o", f"remount,size={size_mb}m", str(path)], check=True, capture_output=True)


# -- a slow, lossy link: veth pair into a namespace, tbf and random drops (netem is not in this kernel) -
def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(command, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")
    return result


class Namespace:
    """A network namespace joined to this one by a veth pair on a /30 of TEST-NET-2 (198.51.100.0/24).

    Not TEST-NET-1: on the CI machine 192.0.2.0/24 is eth0's own network. The /30 is picked at random among
    those no interface here uses, so tests running side by side do not collide.
    """

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.name, self.host_link, self.inside_link = f"ft-{tag}", f"fth{tag}", f"fti{tag}"
        used = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
        free = [b for b in range(0, 256, 4) if not any(f"198.51.100.{b + i}/" in used for i in (1, 2))]
        base = random.choice(free)
        self.host_address, self.inside_address = f"198.51.100.{base + 1}", f"198.51.100.{base + 2}"

    def create(self) -> Namespace:
        """Create the namespace and the veth pair, with addresses, links up."""
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_link, "type", "veth", "peer", "name", self.inside_link)
        _ip("link", "set", self.inside_link, "netns", self.name)
        _ip("addr", "add", f"{self.host_address}/30", "dev", self.host_link)
        _ip("link", "set", self.host_link, "up")
        _ip("addr", "add", f"{self.inside_address}/30", "dev", self.inside_link, netns=self.name)
        _ip("link", "set", self.inside_link, "up", netns=self.name)
        _ip("link", "set", "lo", "up", netns=self.name)
        return self

    def shape(self, rate: str, latency_ms: int, burst: str = "16kb") -> None:
        """Cap both directions with tbf (rate limit; queueing up to `latency_ms` adds delay)."""
        for link, netns in ((self.host_link, None), (self.inside_link, self.name)):
            command = ["tc", "qdisc", "replace", "dev", link, "root", "tbf", "rate", rate, "burst", burst]
            command += ["latency", f"{latency_ms}ms"]
            full = ["ip", "netns", "exec", netns, *command] if netns else command
            result = subprocess.run(full, capture_output=True, text=True)
            if result.returncode != 0:
                pytest.skip(f"tc tbf not available: {result.stderr.strip()}")

    def drop(self, probability: float) -> None:
        """Drop this fraction of packets at random in both directions (iptables statistic, inside the namespace)."""
        for chain in ("INPUT", "OUTPUT"):
            rule = ["iptables", "-A", chain, "-m", "statistic", "--mode", "random"]
            rule += ["--probability", str(probability), "-j", "DROP"]
            result = subprocess.run(["ip", "netns", "exec", self.name, *rule], capture_output=True, text=True)
            if result.returncode != 0:
                pytest.skip(f"iptables statistic match not available: {result.stderr.strip()}")

    def popen(self, command: list[str], **kwargs) -> subprocess.Popen:
        """Start a process inside the namespace."""
        return subprocess.Popen(["ip", "netns", "exec", self.name, *command], **kwargs)

    def destroy(self) -> None:
        """Remove the veth pair and the namespace (the inside end goes with it)."""
        _ip("link", "del", self.host_link, check=False)
        _ip("netns", "del", self.name, check=False)


@contextlib.contextmanager
def namespace() -> Iterator[Namespace]:
    """A fresh namespace with its veth pair; skipped with a reason where this machine cannot make one."""
    need_root("network namespace")
    ns = Namespace()
    try:
        ns.create()
    except RuntimeError as error:
        ns.destroy()
        pytest.skip(f"network namespace: {error}")
    try:
        yield ns
    finally:
        ns.destroy()


@contextlib.contextmanager
def nginx_in_namespace(ns: Namespace, root: Path, port: int = 8080) -> Iterator[str]:
    """`imagenet-train serve` (a real nginx) inside the namespace on its veth address; yields its URL."""
    executable = str(Path(sys.executable).with_name("imagenet-train"))
    log = open(root.parent / f"serve-{ns.name}.log", "w")  # noqa: SIM115 (closed below)
    process = ns.popen(
        [executable, "serve", str(root), "--host", ns.inside_address, "--port", str(port)], stdout=log, stderr=log
    )
    url = f"http://{ns.inside_address}:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                urllib.request.urlopen(url + "/shards.json", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail(f"nginx in {ns.name} did not answer at {url}")
                time.sleep(0.2)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()
