"""`make small-images`: recipes/small-images.yaml on Fashion-MNIST's test set, the figures the recipe reports.

Two targets (issue 34), each over several seeds, through the project's whole path (`fashion-mnist` writes the
images as JPEGs, `shards` packs them, nginx serves them, torchrun trains on --nproc CPU processes):

- the full 60,000-image train set for the recipe's own epochs, with its training wall time;
- a 12,000-image class-balanced subset for 8 epochs.

The recipe was tuned on images held out of the train set (bench/mechanisms.py and the pilots); the 10,000 test
images are read here only, for the figures reported. The section is written into docs/benchmarks.md.

    python bench/small_images.py [--seeds 0 1 2] [--targets full subset]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from common import machine  # noqa: E402 (bench/ is the script's folder)
from mechanisms import RECIPE, train
from pages import replace_section

from imagenet_train.config_files import load_settings
from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.datasets.fashion_mnist import DEBIAN_SOURCE, ValFrom, write_fashion_mnist
from imagenet_train.ops.serve import NginxServer

HEADING = "## small-images on Fashion-MNIST's test set"
TARGETS = {"full": (0, 0), "subset": (12_000, 8)}  # train images (0: all) and epochs (0: the recipe's)


def data(work: Path, source: str, train_size: int) -> Path:
    """Shards of `train_size` train images (0: all 60,000) with the test set as val, made once."""
    raw, shards = work / f"test-{train_size or 'all'}", work / f"shards-{train_size or 'all'}"
    if not (raw / "fashion-mnist.json").is_file():
        write_fashion_mnist(raw, source, val_from=ValFrom.TEST, train_size=train_size, progress=False)
    if not (shards / "shards.json").is_file():
        convert(str(raw), str(shards), ShardOptions(maxcount=2000, workers=2), progress=False)
    return shards


def measure(args: argparse.Namespace) -> dict:
    """Each target's runs, one per seed: top-1 on the test set, the training wall time and the run's wall."""
    work = Path(args.workdir).resolve()
    recipe_epochs = load_settings(Path(args.recipe))["epochs"]
    results = {}
    for target in args.targets:
        train_size, epochs = TARGETS[target]
        args.epochs = epochs or recipe_epochs
        with NginxServer(str(data(work, args.source, train_size))) as server:
            runs = []
            for seed in args.seeds:
                run_dir = work / "runs" / f"{target}-seed{seed}-{int(time.time())}"
                load = os.getloadavg()[0]
                run = train(f"{server.url}/shards.json", run_dir, args, seed, [])
                records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
                run["training_s"] = round(sum(r["epoch_time_s"] for r in records), 1)
                run["load"] = round(load, 1)
                runs.append(run)
                print(f"{target} seed {seed}: top-1 {run['top1']:.4f}, training {run['training_s']:.0f} s", flush=True)
        results[target] = {"train_size": train_size or 60_000, "epochs": args.epochs, "runs": runs}
    return {"targets": results, "machine": machine(), "date": time.strftime("%Y-%m-%d")}


def _each(runs: list[dict], key: str) -> str:
    return " ".join(f"{run[key]:.0f}" for run in runs)


def section(result: dict, args: argparse.Namespace) -> list[str]:
    """The Markdown section: the command, the machine, one row per target with mean and spread."""
    table = []
    for found in result["targets"].values():
        top1 = [r["top1"] for r in found["runs"]]
        spread = statistics.stdev(top1) if len(top1) > 1 else 0.0
        table.append(
            f"| {found['train_size']:,} train images, {found['epochs']} epochs | {statistics.mean(top1):.4f} ± "
            f"{spread:.4f} | {' '.join(f'{t:.4f}' for t in top1)} | "
            f"{_each(found['runs'], 'training_s')} s | {_each(found['runs'], 'seconds')} s | "
            f"{' '.join(str(r['load']) for r in found['runs'])} |"
        )
    seeds = " ".join(map(str, args.seeds))
    return [
        HEADING,
        "",
        f"Measured {result['date']} on {result['machine']} with `python bench/small_images.py --seeds {seeds} "
        f"--targets {' '.join(args.targets)}`. Data: Fashion-MNIST through `imagenet-train fashion-mnist "
        "--val-from test` (train/ from the 60,000 train images, class-balanced where a subset; val/ is the "
        "10,000-image test set, read for these figures only), sharded, served by nginx, trained by torchrun on "
        f"{args.nproc} CPU processes (gloo) with `--config recipes/small-images.yaml` and the row's epochs. "
        "Top-1 on the test set after the last epoch, mean ± standard deviation over the seeds, then each seed's. "
        "Training is the sum of the epochs' times (steps and evaluation) from metrics.jsonl; the run adds "
        "torchrun's start and the model's set-up. Load: the 1-minute load average as each run started.",
        "",
        "| target | top-1 | per seed | training | run | load |",
        "|---|---|---|---|---|---|",
        *table,
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="bench/.work/small-images")
    parser.add_argument("--source", default=DEBIAN_SOURCE, help="Fashion-MNIST's idx files")
    parser.add_argument("--recipe", default=str(RECIPE))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--targets", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--out", default="docs/benchmarks.md")
    args = parser.parse_args()
    args.recipe, args.extra = str(Path(args.recipe).resolve()), []
    result = measure(args)
    Path(args.workdir, "small-images.json").write_text(json.dumps(result, indent=1) + "\n")
    out = Path(args.out)
    out.write_text(
        replace_section(out.read_text() if out.exists() else "# Benchmarks\n", HEADING, section(result, args))
    )
    print(f"wrote {args.out}: {HEADING[3:]}")


if __name__ == "__main__":
    main()
