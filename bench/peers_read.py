"""One read of bench/peers.py in a fresh process: two epochs of one loader (ours, MosaicML streaming or LitData)
over data its own writer made, with the same transform, workers and batch; prints one JSON line.

python bench/peers_read.py LOADER WHERE CACHE [--workers 2]
  LOADER: ours | mosaicml | litdata; WHERE: a local folder or s3:// URL of that loader's data;
  CACHE: an empty folder for the loader's local cache ("" for ours: it streams without one)

Timing starts once the imports are done and the transform is made, before the dataset is: the first batch and
epoch 1 include each loader's own start-up (index reads, worker start, its first downloads); epoch 2 iterates the
same loader again. Ours starts its workers' forkserver as the process starts, before the imports, as
`imagenet-train train` and `evaluate` do: its imports (torch, torchvision) run beside this process's, where each peer
forks workers from a process that has them imported already. A process that makes its first loader without that
early start pays the forkserver's imports in its first batch: bench/first_batch.py's first scenario.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS_SITE = HERE / ".peers"  # `make bench` installs the peers here (bench/peers-requirements.txt), not in the venv
BATCH = 64
CROP = 224

if PEERS_SITE.is_dir():
    sys.path.insert(0, str(PEERS_SITE))

import imagenet_train  # noqa: E402,F401  (before torchvision: its shim for the CPU wheel)


class Sample:
    """A peer's record {"jpg": bytes, "cls": int} -> (uint8 CHW crop, label) through our transform object."""

    def __init__(self, transform: Callable) -> None:
        self.transform = transform

    def __call__(self, record: dict) -> tuple:
        return self.transform(record["jpg"]), int(record["cls"])


def make_transform() -> Callable:
    """The one transform all three run in their workers: simplejpeg decode, RandomResizedCrop 224, flip."""
    from imagenet_train.loading.presets import TrainPreset

    return TrainPreset(CROP, decoder="simplejpeg").build()


def ours(where: str, cache: str, workers: int, transform: Callable) -> Iterable:
    """Our EpochLoader as training builds it (split mode, sizes and sha256 checked), optionally --cache-dir."""
    from imagenet_train.datasets.source import resolve_source
    from imagenet_train.loading.stages import ShardReading
    from imagenet_train.loading.stream import EpochLoader, ShardStream

    source = resolve_source(where.rstrip("/") + "/shards.json")
    stream = ShardStream(
        urls=source.train_urls,
        transform=transform,
        batch_size=BATCH,
        resampled=False,
        shuffle_buffer=1000,
        reading=ShardReading(expected=source.expected, cache_dir=cache),
    )
    loader = EpochLoader(stream, workers)
    return Epochs(loader, lambda batch: batch[0], loader.set_epoch)


def mosaicml(where: str, cache: str, workers: int, transform: Callable) -> Iterable:
    """MosaicML's StreamingDataset (remote into a local cache; a local folder is read in place) and its
    StreamingDataLoader."""
    from streaming import StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    class Dataset(StreamingDataset):
        def __init__(self, sample: Sample, **kwargs) -> None:
            super().__init__(**kwargs)
            self.sample = sample

        def __getitem__(self, index: int) -> tuple:
            return self.sample(super().__getitem__(index))

    clean_stale_shared_memory()
    remote = where.startswith("s3://")
    dataset = Dataset(
        Sample(transform),
        remote=where if remote else None,
        local=cache if remote else where,
        shuffle=True,
        batch_size=BATCH,
    )
    loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers, persistent_workers=True)
    return Epochs(loader, lambda batch: batch[0], lambda epoch: None)


def litdata(where: str, cache: str, workers: int, transform: Callable) -> Iterable:
    """LitData's StreamingDataset (remote chunks into its cache; a local folder read in place) and its
    StreamingDataLoader."""
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming import downloader

    # Its obstore client refuses plain HTTP by default; moto on 127.0.0.1 speaks nothing else (real S3: HTTPS).
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
    dataset = StreamingDataset(where, cache_dir=cache or None, shuffle=True, transform=Sample(transform))
    loader = StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers, persistent_workers=True)
    return Epochs(loader, lambda batch: batch[0], dataset.set_epoch)


class Epochs:
    """A loader, how to take the images out of its batch, and how to move it to the next epoch."""

    def __init__(self, loader: Iterable, images: Callable, set_epoch: Callable[[int], None]) -> None:
        self.loader, self.images, self.set_epoch = loader, images, set_epoch


LOADERS = {"ours": ours, "mosaicml": mosaicml, "litdata": litdata}
# Imported before the clock starts: what is timed is each loader's start-up, not its Python imports.
MODULES = {
    "ours": ("imagenet_train.datasets.source", "imagenet_train.loading.stages", "imagenet_train.loading.stream"),
    "mosaicml": ("streaming", "streaming.base.util"),
    "litdata": ("litdata", "litdata.streaming.downloader"),
}


def read(name: str, where: str, cache: str, workers: int) -> dict:
    """First-batch seconds, epoch 1 and epoch 2 images/s (each batch made the normalised float the model takes)."""
    if name == "ours":  # its workers' forkserver, started as the train and evaluate commands start it: first thing
        from imagenet_train.loading.workers import start_worker_server

        start_worker_server()
    import torch

    from imagenet_train.training.batch_input import normalize

    torch.set_num_threads(1)
    for module in MODULES[name]:
        importlib.import_module(module)
    transform = make_transform()
    began = time.perf_counter()
    epochs = LOADERS[name](where, cache, workers, transform)
    result: dict = {}
    for epoch in (1, 2):
        epochs.set_epoch(epoch)
        start, count = time.perf_counter(), 0
        for batch in epochs.loader:
            count += normalize(epochs.images(batch)).shape[0]
            result.setdefault("first_batch_s", time.perf_counter() - began)
        seconds = time.perf_counter() - (began if epoch == 1 else start)
        result[f"epoch{epoch}"], result[f"images{epoch}"] = count / seconds, count
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("loader", choices=sorted(LOADERS))
    parser.add_argument("where")
    parser.add_argument("cache")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(read(args.loader, args.where, args.cache, args.workers)), flush=True)


if __name__ == "__main__":
    main()
