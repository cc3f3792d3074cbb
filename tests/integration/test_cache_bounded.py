"""The node-local cache under --cache-max-bytes, on real files and file locks: processes sharing one cache
folder, least-recently-used eviction, a copy being read kept, killed writers' partial copies cleared, shards
that cannot be cached read straight through."""

from __future__ import annotations

import fcntl
import hashlib
import io
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from imagenet_train.io import cache_space
from imagenet_train.io.cache import CheckedCopy, cache_path, open_cached, open_verified

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
