"""The node-local cache under --cache-max-bytes, on real files and file locks: processes sharing one cache
folder, least-recently-used eviction, a copy being read kept, killed writers' partial copies cleared, shards
that cannot be cached read straight through."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import logging
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from faults.injectors import small_tmpfs

from imagenet_train.io import cache_space
from imagenet_train.io.cache import CheckedCopy, cache_path, open_cached, open_verified

from conftest import SMALL_TRAIN, read_metrics, torchrun

SHARD = 1000  # bytes per fake shard; the limits below hold two or three of them


def remote_files(tmp_path: Path, count: int) -> dict[str, Path]:
    """`count` fake remote shards: URL -> a local file holding distinct bytes (a real file reports its size)."""
    served = tmp_path / "served"
    served.mkdir()
    urls = {}
    for i in range(count):
        path = served / f"train-{i:06d}.tar"
        path.write_bytes(bytes([i + 1]) * SHARD)
        urls[f"http://shards.example/train-{i:06d}.tar"] = path
    return urls


def opener(urls: dict[str, Path]):
    return lambda url: open(urls[url], "rb")  # noqa: SIM115 (the caller closes it)


def read_all(url: str, cache: Path, urls: dict[str, Path], limit: int) -> bytes:
    with open_cached(url, str(cache), opener(urls), limit) as stream:
        return stream.read()


def cached_names(cache: Path) -> set[str]:
    return {path.name.split("-", 1)[1] for path in cache.iterdir() if not path.name.startswith(".")}


def folder_bytes(cache: Path) -> int:
    return sum(path.stat().st_size for path in cache.iterdir())


def test_the_least_recently_used_copy_is_evicted_and_the_folder_stays_under_the_limit(tmp_path):
    urls = remote_files(tmp_path, 4)
    cache = tmp_path / "cache"
    first, second, third, fourth = urls
    for url in (first, second, first):  # first used last: second is the least recently used
        assert read_all(url, cache, urls, 2 * SHARD + 100) == urls[url].read_bytes()
    assert cached_names(cache) == {"train-000000.tar", "train-000001.tar"}
    assert read_all(third, cache, urls, 2 * SHARD + 100) == urls[third].read_bytes()
    assert cached_names(cache) == {"train-000000.tar", "train-000002.tar"}
    assert read_all(fourth, cache, urls, 2 * SHARD + 100) == urls[fourth].read_bytes()
    assert cached_names(cache) == {"train-000002.tar", "train-000003.tar"}
    assert folder_bytes(cache) <= 2 * SHARD + 100


READER = textwrap.dedent(
    """
    import sys
    from imagenet_train.io.cache import open_cached
    url, path, cache = sys.argv[1:4]
    with open_cached(url, cache, lambda u: open(path, "rb"), int(sys.argv[4])) as stream:
        head = stream.read(10)
        print("reading", flush=True)
        sys.stdin.readline()  # the other process evicts now
        sys.stdout.write("%d %d\\n" % (len(head + stream.read()), type(stream.raw).__name__ == "FileIO"))
    """
)


def test_a_copy_another_process_is_reading_survives_eviction_and_goes_once_closed(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(cache_space, "_warned", set())
    urls = remote_files(tmp_path, 3)
    cache = tmp_path / "cache"
    first, second, third = urls
    limit = SHARD + 100  # room for one copy
    read_all(first, cache, urls, limit)  # cached
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, first, str(urls[first]), str(cache), str(limit)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout.readline() == "reading\n"  # holds the cached copy of `first`
        with caplog.at_level(logging.WARNING):
            assert read_all(second, cache, urls, limit) == urls[second].read_bytes()  # read through, not cached
        assert cached_names(cache) == {"train-000000.tar"}
        assert "every cached shard is in use" in caplog.text
        reader.stdin.write("\n")
        reader.stdin.flush()
        assert reader.stdout.readline().split() == [str(SHARD), "1"]  # all of it, from the cached copy
    finally:
        reader.communicate(timeout=30)
    assert reader.returncode == 0
    assert read_all(third, cache, urls, limit) == urls[third].read_bytes()  # now `first` is idle: evicted
    assert cached_names(cache) == {"train-000002.tar"}


def test_a_killed_writers_partial_copy_is_cleared_and_a_live_writers_is_kept(tmp_path):
    urls = remote_files(tmp_path, 1)
    (url,) = urls
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    stale = cache / ".dead-train.tar.abc.part"
    stale.write_bytes(b"x" * 5 * SHARD)  # a killed writer's: nobody locks it
    live = cache / ".live-train.tar.def.part"
    live.write_bytes(b"y" * SHARD)
    with open(live, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a writer at work (another open file: flock excludes it)
        assert read_all(url, cache, urls, 3 * SHARD) == urls[url].read_bytes()
        assert not stale.exists()
        assert live.exists()
    assert folder_bytes(cache) <= 3 * SHARD


def test_a_shard_of_unknown_size_or_over_the_limit_is_read_without_caching(tmp_path):
    urls = remote_files(tmp_path, 1)
    (url,) = urls
    cache = tmp_path / "cache"
    unsized = lambda u: io.BytesIO(urls[u].read_bytes())  # noqa: E731 (a stream that reports no size)
    with open_cached(url, str(cache), unsized, 10 * SHARD) as stream:
        assert stream.read() == urls[url].read_bytes()
    assert read_all(url, cache, urls, SHARD - 1) == urls[url].read_bytes()
    assert cached_names(cache) == set()
    assert folder_bytes(cache) == 0


def test_a_verified_copy_is_cached_under_the_limit_and_read_through_when_it_cannot_be(tmp_path):
    urls = remote_files(tmp_path, 2)
    first, second = urls
    cache = tmp_path / "cache"
    digests = {url: hashlib.sha256(path.read_bytes()).hexdigest() for url, path in urls.items()}
    with open_verified(first, str(cache), opener(urls), digests[first], SHARD, SHARD + 100) as stream:
        assert isinstance(stream, CheckedCopy)  # checked whole before use: the loader does not hash it again
        assert stream.read() == urls[first].read_bytes()
        with open_verified(second, str(cache), opener(urls), digests[second], SHARD, SHARD + 100) as through:
            assert not isinstance(through, CheckedCopy)  # no room (first is read): the loader checks it at its end
            assert through.read() == urls[second].read_bytes()
    assert Path(cache_path(str(cache), first)).exists()
    assert not Path(cache_path(str(cache), second)).exists()
    assert os.stat(cache_path(str(cache), first)).st_size == SHARD


class Watcher(threading.Thread):
    """Polls a cache folder's total apparent size (and its filesystem's used bytes) until stopped."""

    def __init__(self, folder: Path, mount: Path):
        super().__init__(daemon=True)
        self.folder, self.mount = folder, mount
        self.most_bytes = self.most_used = self.polls = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.01):
            total = 0
            for root, _, files in os.walk(self.folder):
                for name in files:
                    with contextlib.suppress(FileNotFoundError):
                        total += os.lstat(os.path.join(root, name)).st_size
            fs = os.statvfs(self.mount)
            self.most_bytes = max(self.most_bytes, total)
            self.most_used = max(self.most_used, (fs.f_blocks - fs.f_bfree) * fs.f_frsize)
            self.polls += 1


WORKER = textwrap.dedent(
    """
    import random, sys
    from pathlib import Path
    from imagenet_train.io.cache import open_cached
    served, cache, limit, seed = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    files = sorted(served.iterdir())
    order = files * 3
    random.Random(seed).shuffle(order)
    for path in order:
        url = "http://shards.example/" + path.name
        with open_cached(url, cache, lambda u: open(path, "rb"), limit) as stream:
            assert stream.read() == path.read_bytes(), path
    """
)


def test_four_processes_sharing_a_cache_on_a_small_tmpfs_keep_it_under_the_limit(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    for i in range(12):  # 1.2 MB of shards for a 1 MiB tmpfs
        (served / f"train-{i:06d}.tar").write_bytes(os.urandom(100_000))
    limit = 700_000
    with small_tmpfs(tmp_path / "small", 1) as mount:
        cache = mount / "cache"
        watcher = Watcher(cache, mount)
        watcher.start()
        try:
            workers = [
                subprocess.Popen([sys.executable, "-c", WORKER, str(served), str(cache), str(limit), str(seed)])
                for seed in range(4)
            ]
            codes = [worker.wait(timeout=120) for worker in workers]
        finally:
            watcher.stopped.set()
            watcher.join()
        leftovers = [p.name for p in cache.iterdir() if p.name.endswith(".part")]
    assert codes == [0, 0, 0, 0]  # every read matched its source, no ENOSPC
    assert watcher.polls > 10 and 0 < watcher.most_bytes <= limit, (watcher.polls, watcher.most_bytes)
    assert not leftovers


TMPFS_MB = 3  # the digits' shards are 7.3 MB (15 of ~0.5 MB): the cache holds five at most
LIMIT = 5 * 2**19


@pytest.mark.slow  # about 90 s each under load: make faults; the four processes above run in make test
@pytest.mark.timeout(900)
@pytest.mark.parametrize("verify", ["--verify-shards", "--no-verify-shards"])
def test_two_epochs_on_a_tmpfs_smaller_than_the_shards_keep_the_cache_under_its_limit(
    shard_server, digit_shards, tmp_path, verify
):
    assert sum(p.stat().st_size for p in digit_shards.glob("*.tar")) > TMPFS_MB * 2**20
    with small_tmpfs(tmp_path / "small", TMPFS_MB) as mount:
        cache = mount / "cache"
        watcher = Watcher(cache, mount)
        watcher.start()
        try:
            result = torchrun(
                [
                    *("--shards", f"{shard_server.url}/shards.json", "--run-dir", str(tmp_path / "run")),
                    *("--epochs", "2", "--cache-dir", str(cache), "--cache-max-bytes", str(LIMIT), verify),
                    *SMALL_TRAIN,
                ]
            )
        finally:
            watcher.stopped.set()
            watcher.join()
        kept = sorted(p.name for p in cache.iterdir() if p.suffix == ".tar")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "No space left" not in output and "ENOSPC" not in output
    assert [m["epoch"] for m in read_metrics(tmp_path / "run")] == [0, 1]
    assert watcher.polls > 100 and 0 < watcher.most_bytes <= LIMIT, (watcher.polls, watcher.most_bytes)
    assert kept, "nothing was cached"
    print(
        f"polls {watcher.polls}, most {watcher.most_bytes} B of {LIMIT}, tmpfs used {watcher.most_used} B, kept {kept}"
    )


def test_a_second_copy_of_the_same_shard_does_not_replace_one_being_read(tmp_path):
    urls = remote_files(tmp_path, 1)
    (url,) = urls
    cache = tmp_path / "cache"
    late = open_cached(url, str(cache), opener(urls), 3 * SHARD)  # two loaders fetch the same shard at once
    assert read_all(url, cache, urls, 3 * SHARD) == urls[url].read_bytes()
    path = Path(cache_path(str(cache), url))
    with open_cached(url, str(cache), opener(urls), 3 * SHARD) as reading:  # the first copy, being read
        inode = os.fstat(reading.fileno()).st_nlink, path.stat().st_ino
        assert late.read() == urls[url].read_bytes()
        late.close()  # its copy is dropped: renamed over the one read, its blocks would outlive its name
        assert (os.fstat(reading.fileno()).st_nlink, path.stat().st_ino) == inode == (1, inode[1])
        assert reading.read() == urls[url].read_bytes()
    assert sorted(p.name for p in cache.iterdir()) == [".cache.lock", path.name]
