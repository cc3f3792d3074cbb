"""`imagenet-train probe`: is the shard source ready? Fetch the index and read one shard end to end.

The chart runs it twice: inside every training pod before torchrun (`imagenet-train launch --wait-for`, so
a job never starts before its shard server answers or a bucket fill has written the index) and as the
`helm test` hook.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import BinaryIO

from imagenet_train import waiting
from imagenet_train.datasets.source import ShardIndex, load_index
from imagenet_train.errors import ImagenetTrainError, one_line, visible
from imagenet_train.io import storage, tarstream
from imagenet_train.io.integrity import DigestMismatch, VerifyingReader
from imagenet_train.redact import redact


@dataclass(frozen=True)
class ProbeResult:
    index: str
    shards: int
    samples: int
    shard: str
    shard_bytes: int
    shard_samples: int


def read_shard(url: str, io_timeout: float, sha256: str | None = None, size: int | None = None) -> tuple[int, int]:
    """Bytes and samples (distinct keys) of one shard, read through the loaders' own opener and tar reader;
    with `sha256` (the index's), the whole shard is checked against it and `size` as it is read."""
    with storage.open_stream(url, io_timeout=io_timeout) as raw:
        counter = VerifyingReader(raw, sha256, size) if sha256 else _CountingReader(raw)
        try:
            keys = {name.split(".", 1)[0] for name, _ in tarstream.members(counter)}
            counter.finish()
        except tarstream.TarFormatError as error:
            raise ImagenetTrainError(f"{url}: not a readable tar shard ({error})") from None
        except DigestMismatch as error:
            raise ImagenetTrainError(f"{url}: does not match the index: {error}") from None
    return counter.count, len(keys)


class _CountingReader:
    """What VerifyingReader offers the tar reader, counting bytes and checking nothing."""

    def __init__(self, raw: BinaryIO):
        self.raw, self.count = raw, 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.count += len(data)
        return data

    def finish(self) -> None:
        """Nothing to compare: no digest was given."""


def probe(
    location: str, split: str = "train", io_timeout: float = 0.0, trust_index: bool = False, verify: bool = True
) -> ProbeResult:
    """Load the index and read its first shard of `split` (checked against the index's sha256 when `verify`);
    errors name what failed."""
    index: ShardIndex = load_index(location, io_timeout=io_timeout, trust_index=trust_index)
    urls, sizes = index.urls(split), index.sizes(split)
    if not urls:
        raise ImagenetTrainError(f"{index.location}: split '{split}' lists no shards")
    sha256 = index.checksums(split)[0] if verify else None
    nbytes, nsamples = read_shard(urls[0], io_timeout, sha256, index.filesizes(split)[0])
    if nsamples != sizes[0]:
        raise ImagenetTrainError(f"{urls[0]}: {nsamples} samples, the index says {sizes[0]}")
    return ProbeResult(index.location, len(urls), sum(sizes), urls[0], nbytes, nsamples)


def wait_for(
    location: str,
    timeout: float,
    interval: float = 1.0,
    split: str = "train",
    trust_index: bool = False,
    verify: bool = True,
) -> ProbeResult:
    """Probe until it succeeds or `timeout` seconds pass, the reads of an attempt included (a server that
    trickles is cut off at the deadline); the last error is reported."""
    deadline = time.monotonic() + timeout
    stalled = f"{location}: no complete answer in time (a stalled or very slow server?)"
    while True:
        try:
            with waiting.deadline(max(0.0, deadline - time.monotonic()), stalled):
                return probe(location, split, trust_index=trust_index, verify=verify)
        except ImagenetTrainError as error:
            if time.monotonic() + interval > deadline:
                raise ImagenetTrainError(f"{one_line(str(error))} (still failing after {timeout:.0f} s)") from None
            print(visible(redact(f"waiting for shards: {error}")), flush=True)
            waiting.sleep(interval, "waiting for shards")
