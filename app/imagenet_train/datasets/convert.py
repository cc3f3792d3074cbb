"""Converting a dataset into shuffled, deterministic WebDataset shards with a resumable shard index."""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import random
import tarfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import IO

from tqdm import tqdm

from imagenet_train.datasets import images
from imagenet_train.datasets.layouts import Dataset, SourceImage, SourceTooLarge, discover
from imagenet_train.datasets.source import INDEX_KIND, INDEX_NAME, write_json_atomic
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.atomic import atomic_write
from imagenet_train.limits import MAX_IMAGE_PIXELS


@dataclass(frozen=True)
class ShardOptions:
    """How a dataset becomes shards."""

    prefix: str = "imagenet-train"
    maxcount: int = 1000
    maxsize: int = 3_000_000_000
    workers: int = 1
    seed: int = 0
    resize: int | None = None
    quality: int = 90
    verify: str = "full"  # images.ImageCheck: "full" decodes every image, "header" checks header and end marker
    max_pixels: int = MAX_IMAGE_PIXELS  # larger images are skipped (and listed) from their header


@dataclass(frozen=True)
class ShardJob:
    name: str
    split: str
    images: tuple[SourceImage, ...]
    digest: str


def plan_shards(dataset: Dataset, options: ShardOptions) -> list[ShardJob]:
    """Shuffle each split with the seed and cut it into shards by count and size; no I/O."""
    jobs: list[ShardJob] = []
    for split, split_images in dataset.splits.items():
        order = sorted(split_images, key=lambda image: image.key)
        random.Random(f"{options.seed}:{split}").shuffle(order)
        chunks: list[list[SourceImage]] = [[]]
        size = 0
        for image in order:
            full = len(chunks[-1]) >= options.maxcount or (chunks[-1] and size + image.size > options.maxsize)
            if full:
                chunks.append([])
                size = 0
            chunks[-1].append(image)
            size += image.size
        for number, chunk in enumerate(chunks):
            recipe = [options.resize, options.quality, [(i.key, i.wnid, i.describe(), i.size) for i in chunk]]
            digest = hashlib.sha256(json.dumps(recipe).encode()).hexdigest()
            jobs.append(ShardJob(f"{options.prefix}-{split}-{number:06d}.tar", split, tuple(chunk), digest))
    return jobs


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o444
    info.uname = info.gname = ""
    archive.addfile(info, io.BytesIO(data))


class _DigestingWriter(io.RawIOBase):
    """A file that hashes what is written to it, so a shard is never read back just to checksum it."""

    def __init__(self, file: IO[bytes]):
        self.file = file
        self.md5, self.sha256, self.size = hashlib.md5(), hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def write(self, data) -> int:
        self.md5.update(data)
        self.sha256.update(data)
        self.size += len(data)
        return self.file.write(data)

    def close(self) -> None:
        if not self.closed:
            self.file.flush()  # the file is its owner's (atomic_write) to close
        super().close()


def write_shard(job: ShardJob, output: str, class_index: dict[str, int], options: ShardOptions) -> dict:
    """Write one shard (temp file, then rename) and return its index entry with what was skipped."""
    path = os.path.join(output, job.name)
    skipped, reencoded, count = [], [], 0
    with (
        atomic_write(path, buffering=1 << 20) as file,
        _DigestingWriter(file) as sink,
        tarfile.open(fileobj=sink, mode="w", format=tarfile.USTAR_FORMAT) as archive,
    ):
        for image in job.images:
            try:
                data, note = images.prepare(
                    image.read(images.MAX_SOURCE_BYTES),
                    options.resize,
                    options.quality,
                    options.verify,
                    options.max_pixels,
                )
            except (images.UnusableImage, SourceTooLarge) as reason:
                skipped.append({"source": image.describe(), "reason": str(reason)})
                continue
            except OSError as error:
                skipped.append({"source": image.describe(), "reason": f"unreadable ({error.strerror})"})
                continue
            if note:
                reencoded.append({"key": image.key, "source": image.describe(), "reason": note})
            _add(archive, f"{image.key}.jpg", data)
            _add(archive, f"{image.key}.cls", str(class_index[image.wnid]).encode())
            _add(archive, f"{image.key}.wnid", image.wnid.encode())
            count += 1
    return {
        "url": job.name,
        "nsamples": count,
        "filesize": sink.size,
        "md5sum": sink.md5.hexdigest(),
        "sha256": sink.sha256.hexdigest(),
        "digest": job.digest,
        "split": job.split,
        "skipped": skipped,
        "reencoded": reencoded,
    }


def _run_job(args: tuple) -> dict:
    return write_shard(*args)


def _previous_entries(index_path: str) -> dict[str, dict]:
    try:
        with open(index_path) as stream:
            data = json.load(stream)
    except (OSError, json.JSONDecodeError):
        return {}
    return {entry["url"]: entry for entry in data.get("entries", [])}


def _is_done(entry: dict | None, job: ShardJob, output: str) -> bool:
    if not entry or entry.get("digest") != job.digest:
        return False
    path = os.path.join(output, job.name)
    return os.path.exists(path) and os.path.getsize(path) == entry["filesize"]


def build_index(dataset: Dataset, jobs: list[ShardJob], entries: dict[str, dict], options, complete: bool) -> dict:
    """The index document: wids-compatible `shardlist` (train), every split, classes and reports."""
    splits: dict[str, dict] = {}
    for job in jobs:
        entry = entries.get(job.name)
        if entry is None:
            continue
        shard = {k: entry[k] for k in ("url", "nsamples", "filesize", "md5sum", "sha256")}
        split = splits.setdefault(job.split, {"shardlist": [], "nsamples": 0})
        split["shardlist"].append(shard)
        split["nsamples"] += shard["nsamples"]
    done = [entries[j.name] for j in jobs if j.name in entries]
    return {
        "__kind__": INDEX_KIND,
        "wids_version": 1,
        "name": options.prefix,
        "shardlist": splits.get("train", {}).get("shardlist", []),
        "splits": splits,
        "classes": dataset.classes,
        "layout": dataset.layout,
        "options": asdict(options) | {"workers": None},
        "complete": complete,
        "skipped": [s for e in done for s in e["skipped"]],
        "reencoded": [r for e in done for r in e["reencoded"]],
        "entries": done,
    }


def convert(
    source: str,
    output: str,
    options: ShardOptions,
    val_labels: str | None = None,
    progress: bool = True,
    follow_symlinks: bool = False,
) -> dict:
    """Convert the dataset at `source` into shards and `shards.json` in `output`; resumes finished work."""
    if options.maxcount < 1 or options.maxsize < 1 or options.workers < 1:
        raise ImagenetTrainError("--maxcount, --maxsize and --workers must be positive")
    words = [check.value for check in images.ImageCheck]
    if options.verify not in words:
        raise ImagenetTrainError(f"--verify: expected one of {', '.join(words)}, got '{options.verify}'")
    dataset = discover(source, val_labels, follow_symlinks, progress)
    os.makedirs(output, exist_ok=True)
    class_index = {wnid: i for i, wnid in enumerate(dataset.classes)}
    jobs = plan_shards(dataset, options)
    index_path = os.path.join(output, INDEX_NAME)
    previous = _previous_entries(index_path)
    entries = {j.name: previous[j.name] for j in jobs if _is_done(previous.get(j.name), j, output)}
    todo = [j for j in jobs if j.name not in entries]
    bar = tqdm(total=len(jobs), initial=len(entries), unit="shard", disable=not progress)
    for entry in _map(todo, output, class_index, options):
        entries[entry["url"]] = entry
        write_json_atomic(index_path, build_index(dataset, jobs, entries, options, complete=False))
        bar.update()
    bar.close()
    document = build_index(dataset, jobs, entries, options, complete=True)
    write_json_atomic(index_path, document)
    document["resumed_shards"] = len(jobs) - len(todo)
    document["outside_links"] = dataset.outside_links
    return document


def _map(todo: list[ShardJob], output: str, class_index: dict, options: ShardOptions) -> Iterator[dict]:
    arguments = [(job, output, class_index, options) for job in todo]
    if options.workers == 1 or len(todo) <= 1:
        yield from map(_run_job, arguments)
        return
    with multiprocessing.get_context("spawn").Pool(options.workers) as pool:
        yield from pool.imap_unordered(_run_job, arguments)
