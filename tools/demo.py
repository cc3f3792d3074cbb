#!/usr/bin/env python3
"""The main job end to end on the embedded digits dataset: data → shards → nginx → torchrun DDP → results."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.datasets.digits import write_digits
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.ops.serve import NginxServer

# The small-images recipe (timm's ResNet-18 at width 16 with the small stem, 28 px, no crop scale), without its
# flips here (see the command). Its global batch is divided over --nproc processes.
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "small-images.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--workdir", default="demo", help="where the dataset, shards and run go")
    parser.add_argument("--epochs", type=int, default=12, help="training epochs")
    parser.add_argument("--nproc", type=int, default=2, help="torchrun processes")
    args = parser.parse_args()
    work = Path(args.workdir).resolve()
    started = time.time()
    try:
        if not (work / "raw" / "train").is_dir():
            counts = write_digits(work / "raw")
            print(f"demo data: {counts['train']} train / {counts['val']} val digit JPEGs in {work / 'raw'}")
        document = convert(
            str(work / "raw"), str(work / "shards"), ShardOptions(maxcount=100, workers=2), progress=False
        )
        print(
            "shards: "
            + ", ".join(
                f"{s} {i['nsamples']} samples / {len(i['shardlist'])} shards" for s, i in document["splits"].items()
            )
        )
        run_dir = work / "runs" / time.strftime("%Y%m%d-%H%M%S")
        with NginxServer(str(work / "shards")) as server:
            print(f"nginx serving the shards at {server.url}/ (pid {server.pid})", flush=True)
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={args.nproc}",
                "-m",
                "imagenet_train.cli",
                "train",
                "--shards",
                f"{server.url}/shards.json",
                "--run-dir",
                str(run_dir),
                "--epochs",
                str(args.epochs),
                *("--config", str(RECIPE)),
                "--no-hflip",  # the recipe flips photos of things; a mirrored 2 is no digit
            ]
            print("$ " + " ".join(command), flush=True)
            result = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if result.returncode != 0:
            print(f"demo: training failed (exit {result.returncode})", file=sys.stderr)
            return result.returncode
    except ImagenetTrainError as error:
        print(f"demo: error: {error}", file=sys.stderr)
        return 2
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    print(
        f"\nrun directory: {run_dir}\nfinal top-1: {last['top1']:.4f} after {last['epoch'] + 1} epochs; "
        f"wall time {time.time() - started:.0f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
