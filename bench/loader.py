"""P1 and P2: images per second into the training step.

P1: our train pipeline (shards → decode → RandomResizedCrop 224 → flip → batch → normalise) against what
users would write (`torchvision.datasets.ImageFolder` + `DataLoader` over the same JPEGs as files, the same
transforms with ToTensor/Normalize in the workers), with the same number of workers.
P2: the same decode + augment in a bare loop in one process (no loader), times the workers: the limit.
Peer: NVIDIA DALI on its CPU backend, as a DALI user would write it (`fn.readers.webdataset` over the same
shards, `decoders.image_random_crop` + resize + flip, then normalise or not, each batch copied out into a
torch tensor), with as many threads as we have workers.
"""

from __future__ import annotations

import tarfile
import time
from pathlib import Path

import torch

from imagenet_train.compat import ensure_torchvision
from imagenet_train.imagenet_stats import IMAGENET_MEAN, IMAGENET_STD
from imagenet_train.loading.dali import available as dali_available
from imagenet_train.loading.presets import TrainPreset
from imagenet_train.training.batch_input import normalize

try:
    from imagenet_train.datasets.source import resolve_source
    from imagenet_train.loading.stages import ShardReading
    from imagenet_train.loading.stream import EpochLoader, ShardStream
except ImportError:  # the package before the loader split (bench/checks.py runs it as "before")
    from imagenet_train.loading.pipeline import EpochLoader, ShardReading, ShardStream, resolve_source

ensure_torchvision()
from torch.utils.data import DataLoader  # noqa: E402
from torchvision import datasets  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

BATCH = 64


def ours(shards: Path, workers: int, decoder: str, normalized: bool = True) -> float:
    """Images/s through EpochLoader (split mode: every image once); `normalized`: also turned into the
    float batch the model takes, on this CPU (in training that happens on the GPU, after the copy)."""
    source = resolve_source(str(shards))
    stream = ShardStream(
        urls=source.train_urls,
        transform=TrainPreset(224, decoder=decoder).build(),
        batch_size=BATCH,
        resampled=False,
        shuffle_buffer=1000,
        reading=ShardReading(expected=source.expected),  # as in training: sizes and sha256 checked when known
    )
    return _timed(EpochLoader(stream, workers), (lambda batch: normalize(batch[0])) if normalized else (lambda b: b[0]))


def dali_peer(shards: Path, threads: int, normalized: bool = True) -> float:
    """Images/s through DALI's own CPU pipeline over the same shards: read, decode + random-resized-crop,
    resize 224, random flip, then float normalised CHW or uint8 CHW, copied into a torch tensor (DALI reuses
    its output buffers, so a training loop must copy; our `DaliDecoder` does the same)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch.torch_utils import to_torch_tensor

    source = resolve_source(str(shards))

    @pipeline_def(batch_size=BATCH, num_threads=threads, device_id=None, seed=0)
    def pipeline():
        jpegs, labels = fn.readers.webdataset(
            paths=source.train_urls, ext=["jpg", "cls"], random_shuffle=True, initial_fill=1000, name="reader"
        )
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=224, resize_y=224, antialias=True)
        mean = [m * 255 for m in IMAGENET_MEAN] if normalized else [0.0]
        std = [s * 255 for s in IMAGENET_STD] if normalized else [1.0]
        dtype = types.FLOAT if normalized else types.UINT8
        images = fn.crop_mirror_normalize(
            images, mirror=fn.random.coin_flip(), dtype=dtype, output_layout="CHW", mean=mean, std=std
        )
        return images, labels

    pipe = pipeline()
    pipe.build()
    steps = source.train_samples // BATCH
    pipe.run()  # the first batch: start-up is P5's subject, not this one's
    start = time.perf_counter()
    for _ in range(steps - 1):
        images, _ = pipe.run()
        to_torch_tensor(images.as_tensor(), copy=True)
    return (steps - 1) * BATCH / (time.perf_counter() - start)


def baseline_transform() -> v2.Transform:
    """What the torchvision reference script does per image: crop, flip, float, normalise (on PIL input)."""
    return v2.Compose(
        [
            v2.RandomResizedCrop(224, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def baseline(images: Path, workers: int) -> float:
    """Images/s through ImageFolder + DataLoader: PIL decode, v2 RandomResizedCrop, flip, float, normalise."""
    transform = baseline_transform()
    folder = datasets.ImageFolder(str(images / "train"), transform=transform)
    loader = DataLoader(folder, batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=False)
    return _timed(loader, lambda batch: batch[0])


def _timed(loader, consume) -> float:
    """Throughput from the first batch on (worker start-up is P5's subject, not this one's)."""
    count, start = 0, None
    for batch in loader:
        images = consume(batch)
        if start is None:
            start = time.perf_counter()
            continue
        count += images.shape[0]
    return count / (time.perf_counter() - start)


def bare(shards: Path, decoder: str, limit: int = 600) -> float:
    """Images/s of decode + augment alone, one process, JPEG bytes already in memory."""
    transform = TrainPreset(224, decoder=decoder).build()
    jpegs = []
    for url in resolve_source(str(shards)).train_urls:
        with tarfile.open(url) as tar:
            jpegs += [tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".jpg")]
        if len(jpegs) >= limit:
            break
    for data in jpegs[:20]:
        transform(data)
    start = time.perf_counter()
    for data in jpegs[:limit]:
        transform(data)
    return min(limit, len(jpegs)) / (time.perf_counter() - start)


def run(images: Path, shards: Path, workers: int, repeats: int = 3) -> dict:
    """P1 and P2 side by side, interleaved, best of `repeats` each (other tenants only ever slow a run down).

    Within a round, what a ratio compares runs back to back (ours, ImageFolder, DALI; ours uint8, DALI uint8),
    so each round's own ratios (in `runs`) see nearly the same load.
    """
    torch.set_num_threads(1)
    dali = dali_available()
    measures = {
        "ours_simplejpeg": lambda: ours(shards, workers, "simplejpeg"),
        "baseline": lambda: baseline(images, workers),
        **({"dali_cpu": lambda: dali_peer(shards, workers)} if dali else {}),
        "ours_uint8_simplejpeg": lambda: ours(shards, workers, "simplejpeg", normalized=False),
        **({"dali_cpu_uint8": lambda: dali_peer(shards, workers, normalized=False)} if dali else {}),
        "bare_simplejpeg": lambda: bare(shards, "simplejpeg"),
        "ours_fused": lambda: ours(shards, workers, "fused"),
        "ours_uint8_fused": lambda: ours(shards, workers, "fused", normalized=False),
        "bare_fused": lambda: bare(shards, "fused"),
        "bare_pil_baseline_transform": lambda: _bare_baseline(images),
    }
    runs: dict[str, list[float]] = {name: [] for name in measures}
    for _ in range(repeats):
        for name, measure in measures.items():
            runs[name].append(measure())
    best = {name: max(values) for name, values in runs.items()}
    return {"workers": workers, "repeats": repeats, **best, "runs": runs}


def _bare_baseline(images: Path, limit: int = 300) -> float:
    """The baseline's per-image work in a bare loop (PIL decode + its transforms), for the per-image ratio."""
    from PIL import Image

    transform = baseline_transform()
    paths = sorted((images / "train").rglob("*.JPEG"))[:limit]
    start = time.perf_counter()
    for path in paths:
        with Image.open(path) as image:
            transform(image.convert("RGB"))
    return len(paths) / (time.perf_counter() - start)
