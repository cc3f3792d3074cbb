"""What issue 21's input checks cost, side by side: the loader before them (a checkout of the old package on
PYTHONPATH) and with them (this tree), runs alternating A B A B in subprocesses on the same data.

Measured: the P1/P2 loader (split mode, simplejpeg, uint8 batches, the index's sizes and checksums given as in
training) and, with the checks, the same with --no-verify-shards. On a shared machine those swing by 2x from
run to run, so the per-sample costs are also measured alone, in one process, A and B alternating: the old and
the new tar reader over the shards in memory, the header's pixel check, sha256 per image, and the decode.

    python bench/checks.py --before /path/to/old/app [--images 1300 --rounds 3 --workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(shards: Path, workers: int, verify_too: bool) -> dict:
    """One process's figures for the package on its PYTHONPATH."""
    import torch

    try:
        from imagenet_train.datasets.source import resolve_source
        from imagenet_train.loading.stages import ShardReading
        from imagenet_train.loading.stream import EpochLoader, ShardStream
    except ImportError:  # the "before" package (7d64f4e): one loading/pipeline.py
        from imagenet_train.loading.pipeline import EpochLoader, ShardReading, ShardStream, resolve_source

    sys.path.insert(0, str(HERE))
    import loader

    torch.set_num_threads(1)
    source = resolve_source(str(shards))

    def ours(**reading) -> float:
        stream = ShardStream(
            urls=source.train_urls,
            transform=loader.TrainPreset(224).build(),
            batch_size=loader.BATCH,
            resampled=False,
            reading=ShardReading(expected=source.expected, **reading),
        )
        return loader._timed(EpochLoader(stream, workers), lambda batch: batch[0])

    result = {"loader_uint8": ours()}
    if verify_too:
        result["loader_uint8_no_verify"] = ours(verify=False)
    return result


def micro(shards: Path, before: str, rounds: int) -> dict:
    """Per-sample microseconds, old and new side by side in this process (best of `rounds` each)."""
    import hashlib
    import importlib.util
    import io

    import simplejpeg

    from imagenet_train.datasets.pixels import check_pixels
    from imagenet_train.datasets.source import resolve_source
    from imagenet_train.io import tarstream

    spec = importlib.util.spec_from_file_location("old_tarstream", Path(before) / "imagenet_train/io/tarstream.py")
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    blobs = [Path(url).read_bytes() for url in resolve_source(str(shards)).train_urls]
    jpegs = [data for blob in blobs for name, data in tarstream.members(io.BytesIO(blob)) if name.endswith(".jpg")]

    def per_item(fn, items) -> float:
        start = time.perf_counter()
        for item in items:
            fn(item)
        return (time.perf_counter() - start) / len(items) * 1e6

    def header_check(data: bytes) -> None:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        check_pixels(width, height, 1 << 26)

    figures: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, fn, items in (
            ("tar_old_us_per_sample", lambda b: sum(1 for _ in old.members(io.BytesIO(b))), blobs),
            ("tar_new_us_per_sample", lambda b: sum(1 for _ in tarstream.members(io.BytesIO(b))), blobs),
            ("pixel_check_us", header_check, jpegs),
            ("sha256_us_per_image", lambda b: hashlib.sha256(b).digest(), blobs),
            ("decode_us", simplejpeg.decode_jpeg, jpegs[:200]),
        ):
            scale = len(blobs) / len(jpegs) if name.startswith(("tar", "sha")) else 1.0
            figures.setdefault(name, []).append(per_item(fn, items) * scale)
    return {name: min(values) for name, values in figures.items()} | {
        "mean_jpeg_kb": sum(map(len, jpegs)) / len(jpegs) / 1e3
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the old package's directory (its app/)")
    parser.add_argument("--images", type=int, default=1300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workdir", default="bench/.work")
    parser.add_argument("--measure", default="", help=argparse.SUPPRESS)  # internal: a subprocess's shard dir
    parser.add_argument("--verify-too", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(Path(args.measure), args.workers, args.verify_too)))
        return
    sys.path.insert(0, str(HERE))
    import common

    from imagenet_train.datasets.convert import ShardOptions, convert

    work = Path(args.workdir)
    images = common.imagenet_like(work / f"images-{args.images}", args.images)
    shards = work / f"shards-{args.images}"
    if not (shards / "shards.json").exists():
        convert(str(images), str(shards), ShardOptions(maxcount=250, verify="header"), progress=False)
    print("micro", json.dumps(micro(shards, args.before, 5)), flush=True)
    after = str(HERE.parent / "app")
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name, path in (("before", args.before), ("after", after)):
            load = os.getloadavg()[0]
            command = [sys.executable, __file__, "--measure", str(shards), "--workers", str(args.workers)]
            command += ["--before", args.before] + (["--verify-too"] if name == "after" else [])
            env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
            output = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout
            runs[name].append({**json.loads(output.splitlines()[-1]), "load": [load, os.getloadavg()[0]]})
            print(name, runs[name][-1], flush=True)
    print(json.dumps(runs))


if __name__ == "__main__":
    main()
