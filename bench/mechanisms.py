"""`make mechanisms`: what each recipe mechanism does to accuracy, on Fashion-MNIST, one switched at a time.

The rows train recipes/small-images.yaml (or --recipe) as it is, then with one mechanism switched the other way
(on where the recipe has it off, off where it has it on): EMA, label smoothing, mixup/cutmix, TrivialAugment,
random erasing, progressive resizing low -> high, test-time flip, repeated augmentation (where this revision
has --ra-reps), and LARS at 8x the global batch (beside plain SGD at 8x, which tells the batch from the
optimizer). Same epochs, same seeds, same data for every row.

The data go the project's whole way: `fashion-mnist` writes a class-balanced subset of the 60,000 train images
and a held-out validation set (never the test set: this table is for choosing, the test set is for the
figures a recipe reports), `shards` packs them, nginx serves them, torchrun trains on --nproc CPU processes.
The section is written into docs/benchmarks.md, replacing its previous version; the rest of the page stays.

    python bench/mechanisms.py [--epochs 8] [--seeds 0 1] [--train-size 12000] [--rows recipe ema ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import machine  # noqa: E402 (bench/ is the script's folder)
from pages import replace_section

from imagenet_train.config import defaults
from imagenet_train.config_files import load_settings
from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.datasets.fashion_mnist import DEBIAN_SOURCE, write_fashion_mnist
from imagenet_train.ops.serve import NginxServer

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "small-images.yaml"
HEADING = "## Mechanisms on Fashion-MNIST: the small-images recipe with one mechanism switched at a time"
BATCH_FACTOR = 8  # LARS and LAMB are large-batch optimizers: the row trains at 8x the recipe's global batch


@dataclass(frozen=True)
class Mechanism:
    """One row: how to tell whether a recipe has the mechanism on, and the flags that switch it each way."""

    name: str
    is_on: Callable[[dict[str, Any]], bool]
    on: Callable[[dict[str, Any]], list[str]]
    off: Callable[[dict[str, Any]], list[str]]
    needs: str = ""  # a setting this revision must declare for the row to exist (else it is left out, and said)

    def flags(self, recipe: dict[str, Any]) -> tuple[str, list[str]]:
        """'on' or 'off' (what the row does to the recipe) and the flags that do it."""
        return ("off", self.off(recipe)) if self.is_on(recipe) else ("on", self.on(recipe))


def _const(*flags: str) -> Callable[[dict[str, Any]], list[str]]:
    return lambda _recipe: list(flags)


def _global_batch(recipe: dict[str, Any]) -> int:
    return recipe["global_batch_size"] or recipe["batch_size"] * recipe["_nproc"]


def _progressive_on(recipe: dict[str, Any]) -> list[str]:
    """FFCV's ramp from half the crop to the crop, ending two epochs before the last (as FFCV's configs do)."""
    size, end = recipe["train_crop_size"], max(0, recipe["epochs"] - 2)
    step = 32 if size >= 128 else 4  # FFCV's 32 at ImageNet sizes; in 32s a 14 -> 28 px ramp is one jump
    return [
        *("--progressive-start-size", str(max(8, size // 2)), "--progressive-end-size", str(size)),
        *("--progressive-start-epoch", "0", "--progressive-end-epoch", str(end), "--progressive-step", str(step)),
    ]


def _large_batch(opt: str) -> Callable[[dict[str, Any]], list[str]]:
    """The recipe at BATCH_FACTOR x its global batch with `opt` (its LR per 256 images scales with the batch)."""
    return lambda recipe: ["--opt", opt, "--global-batch-size", str(_global_batch(recipe) * BATCH_FACTOR)]


def _small_batch(recipe: dict[str, Any]) -> list[str]:
    return ["--opt", "sgd", "--global-batch-size", str(max(1, _global_batch(recipe) // BATCH_FACTOR))]


MECHANISMS = {
    "ema": Mechanism("EMA", lambda r: r["model_ema"], _const("--model-ema"), _const("--no-model-ema")),
    "label-smoothing": Mechanism(
        "label smoothing 0.1",
        lambda r: r["label_smoothing"] > 0,
        _const("--label-smoothing", "0.1"),
        _const("--label-smoothing", "0"),
    ),
    "mixup-cutmix": Mechanism(
        "mixup 0.2 / cutmix 1.0",
        lambda r: r["mixup_alpha"] > 0 or r["cutmix_alpha"] > 0,
        _const("--mixup-alpha", "0.2", "--cutmix-alpha", "1.0"),
        _const("--mixup-alpha", "0", "--cutmix-alpha", "0"),
    ),
    "trivialaugment": Mechanism(
        "TrivialAugment",
        lambda r: r["auto_augment"] != "none",
        _const("--auto-augment", "ta_wide"),
        _const("--auto-augment", "none"),
    ),
    "random-erasing": Mechanism(
        "random erasing 0.25",
        lambda r: r["random_erase"] > 0,
        _const("--random-erase", "0.25"),
        _const("--random-erase", "0"),
    ),
    "progressive": Mechanism(
        "progressive resizing low -> high",
        lambda r: bool(r["progressive_start_size"] and r["progressive_end_size"]),
        _progressive_on,
        _const("--progressive-start-size", "0", "--progressive-end-size", "0"),
    ),
    "tta": Mechanism("test-time flip", lambda r: r["val_tta"], _const("--val-tta"), _const("--no-val-tta")),
    "ra": Mechanism(
        "repeated augmentation x3",
        lambda r: r.get("ra_reps", 1) > 1,
        _const("--ra-reps", "3"),
        _const("--ra-reps", "1"),
        needs="ra_reps",
    ),
    "sgd-8x": Mechanism(
        f"SGD at {BATCH_FACTOR}x the batch", lambda r: False, _large_batch("sgd"), _const()
    ),  # the control for the next row: the batch alone
    "lars-8x": Mechanism(
        f"LARS at {BATCH_FACTOR}x the batch",
        lambda r: r["opt"] in ("lars", "lamb"),
        _large_batch("lars"),
        _small_batch,
    ),
}
ROWS = ["recipe", *MECHANISMS]


def plan_rows(recipe_path: Path, names: list[str], nproc: int, epochs: int) -> tuple[list[dict], list[str]]:
    """Each asked-for row's name, direction and flags against the recipe; and the rows this revision lacks."""
    recipe = {**defaults(), **load_settings(recipe_path), "epochs": epochs, "_nproc": nproc}
    declared = defaults()
    rows, missing = [], []
    for name in names:
        if name == "recipe":
            rows.append({"row": "recipe", "label": "the recipe as it is", "switch": "", "flags": []})
            continue
        mechanism = MECHANISMS[name]
        if mechanism.needs and mechanism.needs not in declared:
            missing.append(f"{mechanism.name} (no --{mechanism.needs.replace('_', '-')} at this revision)")
            continue
        switch, flags = mechanism.flags(recipe)
        rows.append({"row": name, "label": mechanism.name, "switch": switch, "flags": flags})
    return rows, missing


def train(shards: str, run_dir: Path, args: argparse.Namespace, seed: int, flags: list[str]) -> dict:
    """One torchrun training run of the recipe plus `flags`: its last top-1 and its wall time."""
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}"),
        *("-m", "imagenet_train.cli", "train", "--shards", shards, "--run-dir", str(run_dir)),
        *("--config", str(args.recipe), "--epochs", str(args.epochs), "--seed", str(seed), "--no-tensorboard"),
        *args.extra,
        *flags,
    ]
    started = time.time()
    done = subprocess.run(
        command, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    if done.returncode:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"mechanisms: {run_dir.name} failed (exit {done.returncode}): {tail[0]}")
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    return {"seed": seed, "top1": last["top1"], "seconds": round(time.time() - started, 1)}


def measure(args: argparse.Namespace) -> dict:
    """Every row's run for every seed (the rows interleaved within a seed, so load drifts hit them alike)."""
    work = Path(args.workdir).resolve()
    raw = work / f"fashion-mnist-{args.train_size}-{args.holdout}-{args.data_seed}"
    if not (raw / "fashion-mnist.json").is_file():
        write_fashion_mnist(
            raw, args.source, holdout=args.holdout, train_size=args.train_size, seed=args.data_seed, progress=False
        )
    convert(str(raw), str(work / "shards"), ShardOptions(maxcount=1000, workers=2), progress=False)
    rows, missing = plan_rows(Path(args.recipe), args.rows, args.nproc, args.epochs)
    load = [os.getloadavg()]
    with NginxServer(str(work / "shards")) as server:
        for seed in args.seeds:
            for row in rows:
                run_dir = work / "runs" / f"{row['row']}-seed{seed}-{int(time.time())}"
                result = train(f"{server.url}/shards.json", run_dir, args, seed, row["flags"])
                row.setdefault("runs", []).append(result)
                print(f"{row['row']} seed {seed}: top-1 {result['top1']:.4f} in {result['seconds']:.0f} s", flush=True)
    load.append(os.getloadavg())
    counts = json.loads((raw / "fashion-mnist.json").read_text())["counts"]
    return {
        "rows": rows,
        "missing": missing,
        "counts": counts,
        "load": [[round(x, 1) for x in triple] for triple in load],
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces the table."""
    words = ["python", "bench/mechanisms.py", "--epochs", str(args.epochs), "--seeds", *map(str, args.seeds)]
    words += ["--train-size", str(args.train_size), "--holdout", str(args.holdout), "--nproc", str(args.nproc)]
    if args.rows != ROWS:
        words += ["--rows", *args.rows]
    if args.extra:
        words += [f"--extra={shlex.join(args.extra)}"]
    return shlex.join(words)


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def section(result: dict, args: argparse.Namespace, seconds: float) -> list[str]:
    """The Markdown section: the command, the machine and load, one row per mechanism with mean and spread."""
    rows = result["rows"]
    base = statistics.mean(r["top1"] for r in rows[0]["runs"]) if rows and rows[0]["row"] == "recipe" else None
    table = []
    for row in rows:
        top1 = [r["top1"] for r in row["runs"]]
        mean = statistics.mean(top1)
        spread = statistics.stdev(top1) if len(top1) > 1 else 0.0
        delta = f"{mean - base:+.4f}" if base is not None and row["row"] != "recipe" else ""
        switched = f"{row['switch']}: `{shlex.join(row['flags'])}`" if row["flags"] else "(none)"
        table.append(
            f"| {row['label']} | {switched} | {mean:.4f} ± {spread:.4f} | {delta} | "
            f"{' '.join(f'{t:.4f}' for t in top1)} | {statistics.mean(r['seconds'] for r in row['runs']):.0f} s |"
        )
    counts, load = result["counts"], result["load"]
    lines = [
        HEADING,
        "",
        f"Measured {result['date']} on {result['machine']} with `{command_line(args)}`, {seconds:.0f} s in all; "
        f"load average {load[0][0]} at the start and {load[-1][0]} at the end. Data: Fashion-MNIST through "
        f"`imagenet-train fashion-mnist` ({counts['train']} class-balanced train images, {counts['val']} held "
        "out of the train set as val: never the test set), sharded, served by nginx, trained by torchrun on "
        f"{args.nproc} CPU processes (gloo) with `--config {_shown(Path(args.recipe))}` for "
        f"{args.epochs} epochs. Each row switches one mechanism the other way from the recipe; top-1 is on the "
        "held-out val after the last epoch, mean ± standard deviation over the seeds, then each seed's.",
        "",
        "| row | switched | top-1 | vs the recipe | per seed | wall (mean) |",
        "|---|---|---|---|---|---|",
        *table,
        "",
    ]
    if result["missing"]:
        lines += [f"Not at this revision: {'; '.join(result['missing'])}.", ""]
    return lines


def write(out: Path, lines: list[str]) -> None:
    """Replace the page's section under HEADING (or append it), keeping every other line."""
    out.write_text(replace_section(out.read_text() if out.exists() else "# Benchmarks\n", HEADING, lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="bench/.work/mechanisms")
    parser.add_argument("--source", default=DEBIAN_SOURCE, help="Fashion-MNIST's idx files")
    parser.add_argument("--recipe", default=str(RECIPE))
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--train-size", type=int, default=12_000, help="class-balanced train subset")
    parser.add_argument("--holdout", type=int, default=5000, help="train images held out as val")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the subset and the holdout")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=ROWS)
    parser.add_argument("--extra", type=shlex.split, default=[], help="train flags added to every row, quoted")
    parser.add_argument("--out", default="docs/benchmarks.md")
    args = parser.parse_args()
    args.recipe = str(Path(args.recipe).resolve())
    started = time.time()
    result = measure(args)
    Path(args.workdir, "mechanisms.json").write_text(json.dumps(result, indent=1) + "\n")
    write(Path(args.out), section(result, args, time.time() - started))
    print(f"wrote {args.out}: {HEADING[3:]}")


if __name__ == "__main__":
    main()
