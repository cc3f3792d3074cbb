"""The loader's images/s per core at 160, 192 and 224 px train crops, from full-size and from resized shards.

One DataLoader worker process is one core's worth of loading: the real EpochLoader over a ShardStream in
resampled mode (the training default: shards drawn at random, four read at once, sizes and sha256 checked),
TrainPreset(size) with the simplejpeg decoder and, where PyTurboJPEG loads, the fused one, uint8 batches
(training normalises on the GPU). The process here only receives the batches. A figure is images per second
of the worker's own CPU time (user + system, /proc/PID/stat) over the batches after the first, until it used
`--seconds` of CPU: on a shared machine the worker gets a varying share of a core, and wall-clock rates
(kept in the results too) fall with the load. Every configuration runs once per round and each round starts
one configuration later, so what drift is left spreads over all of them. Prints the results as one JSON
line; bench/benchmarks_page.py (`--only percore`) runs this in a fresh process and writes docs/benchmarks.md.

python bench/percore.py [--workdir bench/.work] [--rounds 3] [--seconds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import torch  # noqa: E402
from percore_table import KINDS, LARGE_SIDES, RESIZES, configurations, key  # noqa: E402

from imagenet_train.choices import Decoder  # noqa: E402
from imagenet_train.datasets.convert import ShardOptions  # noqa: E402
from imagenet_train.datasets.convert import convert as make_shards  # noqa: E402
from imagenet_train.datasets.source import resolve_source  # noqa: E402
from imagenet_train.loading import fused_decoder, workers  # noqa: E402
from imagenet_train.loading.presets import TrainPreset  # noqa: E402
from imagenet_train.loading.stages import ShardReading  # noqa: E402
from imagenet_train.loading.stream import EpochLoader, ShardStream  # noqa: E402

BATCH = 32  # small, so the slowest configuration still hands over several batches within `seconds`
SHUFFLE = 100  # its first fill is not timed, and the work per image does not depend on its size
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LARGE_COUNT = 160  # resampled reading draws from these over and over; only the rate is wanted
RESIZE_COUNT = 600  # the first of the standard set, re-encoded by `shards --resize`


def shard_sets(images: Path, shards: Path, work: Path) -> dict[str, Path]:
    """The shard directory of each kind: the standard set's `shards`, the others written once under `work`."""
    large = common.imagenet_like(work / f"images-large-{LARGE_COUNT}", LARGE_COUNT, short_sides=LARGE_SIDES)
    standard = first_images(images, work / f"images-first-{RESIZE_COUNT}", RESIZE_COUNT)
    sets = {"full": shards}
    for kind, source, resize in [("large", large, None), *((f"resize{n}", standard, n) for n in RESIZES)]:
        out = work / f"percore-{kind}-{source.name}"
        if not (out / "shards.json").exists():
            options = ShardOptions(maxcount=40, workers=os.cpu_count() or 1, resize=resize)
            make_shards(str(source), str(out), options, progress=False)
        sets[kind] = out
    return sets


def first_images(images: Path, root: Path, count: int) -> Path:
    """The first `count` images of an ImageFolder tree, hard-linked into `root` in the same layout."""
    if not root.exists():
        scratch = root.with_name(root.name + ".partial")
        shutil.rmtree(scratch, ignore_errors=True)
        for path in sorted((images / "train").rglob("*.JPEG"))[:count]:
            target = scratch / path.relative_to(images)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError:
                shutil.copyfile(path, target)
        scratch.rename(root)
    return root


def mean_sample_kb(shards: Path) -> float:
    """Mean kB a training sample takes in the shards (its JPEG, label members and tar headers)."""
    entries = json.loads((shards / "shards.json").read_text())["entries"]
    return sum(e["filesize"] for e in entries) / max(sum(e["nsamples"] for e in entries), 1) / 1e3


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process (all its threads) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def per_core(shards: Path, crop: int, decoder: Decoder, seconds: float) -> dict:
    """One loader worker over the batches after the first, until it has used `seconds` of CPU (4 batches at
    least): images per CPU-second of the worker (`per_core`), per wall second, and the CPU the receiving
    process spent per image."""
    source = resolve_source(str(shards))
    stream = ShardStream(
        urls=source.train_urls,
        transform=TrainPreset(crop, decoder=decoder).build(),
        batch_size=BATCH,
        resampled=True,
        shuffle_buffer=SHUFFLE,
        reading=ShardReading(expected=source.expected),
    )
    loader = EpochLoader(stream, workers=1, batches=1 << 30)
    try:
        count, batches, pid, start = 0, 0, 0, (0.0, 0.0, 0.0)
        for images, *_ in loader:
            if not pid:  # the worker's start and the shuffle buffer's first fill are not counted
                pid = loader.loader._iterator._workers[0].pid  # the one worker process (torch's own attribute)
                start = (time.perf_counter(), cpu_seconds(pid), time.process_time())
                continue
            count, batches = count + images.shape[0], batches + 1
            if batches >= 4 and cpu_seconds(pid) - start[1] >= seconds:
                break
        wall, worker, receiving = (
            time.perf_counter() - start[0],
            cpu_seconds(pid) - start[1],
            time.process_time() - start[2],
        )
        return {"per_core": count / worker, "wall": count / wall, "receive_ms": 1e3 * receiving / count}
    finally:
        loader.close()


def run(images: Path, shards: Path, work: Path, rounds: int = 3, seconds: float = 1.0) -> dict:
    """Every configuration once per round; the figures of each round and the load average before each."""
    # Each configuration starts a fresh worker: with the decoders imported in the forkserver it does not import
    # torchvision again (~5 s on a loaded 2-core machine). Training's workers persist and pay that once.
    workers.FORKSERVER_PRELOAD.extend(["imagenet_train.loading.presets", "imagenet_train.loading.fused_decoder"])
    torch.set_num_threads(1)
    began = time.time()
    sets = shard_sets(images, shards, work)
    prepared = time.time()
    decoders = [Decoder.SIMPLEJPEG, *([Decoder.FUSED] if fused_decoder.available() else [])]
    order = configurations([str(d) for d in decoders])
    runs: dict[str, list[dict]] = {key(*c): [] for c in order}
    loads = []
    for number in range(rounds):
        loads.append(round(os.getloadavg()[0], 2))
        shift = number % len(order)
        for crop, kind, decoder in order[shift:] + order[:shift]:
            runs[key(crop, kind, decoder)].append(per_core(sets[kind], crop, Decoder(decoder), seconds))
        print(f"  round {number + 1}/{rounds} done (load {loads[-1]:.1f})", file=sys.stderr, flush=True)
    loads.append(round(os.getloadavg()[0], 2))
    return {
        "rounds": rounds,
        "seconds": seconds,
        "batch": BATCH,
        "decoders": [str(d) for d in decoders],
        "sample_kb": {kind: round(mean_sample_kb(sets[kind]), 1) for kind in KINDS},
        "runs": {name: [round(v["per_core"], 1) for v in values] for name, values in runs.items()},
        "median": {name: round(statistics.median(v["per_core"] for v in values), 1) for name, values in runs.items()},
        "wall": {name: [round(v["wall"], 1) for v in values] for name, values in runs.items()},
        "receive_ms": round(statistics.median(v["receive_ms"] for values in runs.values() for v in values), 3),
        "round_loads": loads,
        "setup_s": round(prepared - began),
        "measure_s": round(time.time() - prepared),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="bench/.work")
    parser.add_argument("--images", type=int, default=2600, help="standard JPEGs (as make bench makes them)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="worker CPU-seconds per configuration and round")
    args = parser.parse_args()
    work = Path(args.workdir).resolve()
    images = common.imagenet_like(work / "images", args.images)
    shards = work / "shards"
    if not (shards / "shards.json").exists():
        make_shards(str(images), str(shards), ShardOptions(maxcount=200, workers=os.cpu_count() or 1), progress=False)
    print(json.dumps(run(images, shards, work, args.rounds, args.seconds)))


if __name__ == "__main__":
    main()
