"""The peers section of docs/benchmarks.md from bench/peers.py's figures (pure: no I/O).

`results["reads"][where][loader]` holds one dict per round ({"first_batch_s", "epoch1", "epoch2"}: seconds and
images/s), `results["convert"][writer]` one time in seconds per round. Every ratio is a speed ratio (above 1x
the first named is faster), taken within each round, where both ran one after the other, then the median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

HEADING = "## Peers: MosaicML streaming and LitData"
NAMES = {"ours": "ours", "mosaicml": "MosaicML streaming", "litdata": "LitData"}
PAIRS = (("ours", "mosaicml"), ("ours", "litdata"), ("mosaicml", "litdata"))
PLACES = {"local": "local disk", "s3": "S3 (moto on 127.0.0.1)"}
# measure -> (row title, unit, whether more is better)
MEASURES = {
    "epoch1": ("epoch 1, cold (caches emptied, start-up included)", "img/s", True),
    "epoch2": ("epoch 2", "img/s", True),
    "first_batch_s": ("first batch of epoch 1, from making the dataset", "s", False),
}
COMMAND = "python bench/peers.py --images {images} --rounds {rounds} --workers {workers}"


def median(values: Sequence[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count)."""
    return float(statistics.median(values))


def speed_ratios(first: Sequence[float], second: Sequence[float], more_is_better: bool) -> list[float]:
    """How many times faster `first` was than `second` in each round (rates: a/b; seconds: b/a)."""
    pairs = zip(first, second, strict=True)
    return [a / b if more_is_better else b / a for a, b in pairs]


def ratio_cell(first: Sequence[float], second: Sequence[float], more_is_better: bool) -> str:
    """The median of the per-round speed ratios, bold, with each round's own in brackets."""
    ratios = speed_ratios(first, second, more_is_better)
    return f"**{median(ratios):.2f}x** ({', '.join(f'{r:.2f}' for r in ratios)})"


def figure(values: Sequence[float], unit: str) -> str:
    """A median as the table shows it: seconds with two decimals, rates whole."""
    return f"{median(values):.2f} s" if unit == "s" else f"{median(values):.0f} {unit}"


def row(title: str, unit: str, more: bool, runs: dict[str, list[float]]) -> str:
    """One table row: the three medians, then the three pairs' speed ratios."""
    cells = [figure(runs[name], unit) for name in NAMES]
    cells += [ratio_cell(runs[a], runs[b], more) for a, b in PAIRS]
    return f"| {title} | {' | '.join(cells)} |"


def per_measure(rounds: dict[str, list[dict]], measure: str, ours: str = "ours") -> dict[str, list[float]]:
    """One measure's per-round figures for the three loaders, with `ours` standing for our loader."""
    return {name: [run[measure] for run in rounds[ours if name == "ours" else name]] for name in NAMES}


def rows(results: dict) -> list[str]:
    """The table: conversion, then each place's epochs and first batch (S3 also with our --cache-dir)."""
    lines = [
        "| measure | ours | MosaicML streaming | LitData | ours / MosaicML | ours / LitData | MosaicML / LitData |",
        "|---|---|---|---|---|---|---|",
        row(f"conversion of {results['images']} JPEGs, each with its own writer", "s", False, results["convert"]),
    ]
    for place, reads in results["reads"].items():
        for measure, (title, unit, more) in MEASURES.items():
            lines.append(row(f"{PLACES[place]}: {title}", unit, more, per_measure(reads, measure)))
            if "ours_cache" in reads:
                mixed = per_measure(reads, measure, ours="ours_cache")
                lines.append(row(f"{PLACES[place]}: {title}, ours with --cache-dir", unit, more, mixed))
    return lines


UNFAIRNESSES = [
    "Ours checks each shard's size and sha256 against its index as it reads (training's default); MosaicML "
    "streaming and LitData check nothing by default (MDS can hash shards if asked; LitData has no such check).",
    "Conversion: ours (`imagenet-train shards`, `--verify full`, its default) decodes every JPEG to refuse broken "
    "ones and hashes each shard; `MDSWriter` and `litdata.optimize` store the bytes as given. `MDSWriter` is one "
    "process (MosaicML's way to parallelise is several writers and a merged index, not used here); ours and "
    "`litdata.optimize` run the given number of workers; `litdata.optimize` starts them with spawn (its default "
    "outside notebooks), so each imports torch, LitData and bench/peers.py's own imports afresh, which its time "
    "includes.",
    "Shard size: ours 200 images a shard (~22 MB, bench's setting, as P1); MosaicML and LitData 64 MB (MDS's "
    "default `size_limit`, LitData's `chunk_bytes` set to the same, it has no default), so the peers open fewer, "
    "larger files.",
    "Caches: from S3, both peers download whole shards into their local cache and read epoch 2 from it; ours "
    "streams every epoch from the server unless `--cache-dir` is given (its row). Epoch 1 empties every cache, "
    "but the operating system's page cache is warm for all three (the files were just written or uploaded): "
    "`cold` here means cold loaders, not cold disks.",
    "Local disk: the peers read their folders in place (MosaicML as `local` with no `remote`, LitData as "
    "`input_dir`), ours reads the shards by path; no copy is made by any.",
    "Workers: ours starts its workers through a forkserver that preloads the decoders, started as the process "
    "starts, before the clock, as `imagenet-train train` and `evaluate` start it (its imports run beside the "
    "process's own; bench/first_batch.py's first scenario is the first batch without that early start); both "
    "peers use torch's DataLoader with fork, from a process that has imported everything. All three keep their "
    "workers across the two epochs.",
    "Order: ours shuffles shards and a 1,000-sample buffer; MosaicML uses its default shuffle (py1e) and "
    "LitData its own; the samples read are the same set, in different orders.",
]


def block(results: dict) -> list[str]:
    """The whole `## ` section: how it was measured, the table, and what still is not equal."""
    load = results["load"]
    versions = ", ".join(f"{NAMES[name]} {version}" for name, version in results["versions"].items())
    asked = results.get("asked", results["rounds"])
    command = COMMAND.format(images=results["images"], rounds=asked, workers=results["workers"])
    cut = f" (cut short: {results['rounds']} of the {asked} asked for)" if results["rounds"] < asked else ""
    return [
        HEADING,
        "",
        f"Measured {results['date']} on {results['machine']} by `{command}` (part of `make bench`); 1-minute load "
        f"average {load[0]:.1f} at the start, {load[1]:.1f} at the end (2 cores shared with other jobs: absolute "
        "rates drift with it, ratios within a round much less). Versions: "
        f"{versions} (bench-only: bench/peers-requirements.txt, installed into bench/.peers, never the image).",
        "",
        f"The same {results['images']} ImageNet-like JPEGs as P1 were converted by each loader's own writer "
        "(ours: `imagenet-train shards`; `streaming.MDSWriter`; `litdata.optimize`) and read by its own dataset "
        "class and loader (`EpochLoader`; `streaming.StreamingDataset` + `StreamingDataLoader`; "
        "`litdata.StreamingDataset` + `StreamingDataLoader`), each with the same transform object in its workers "
        f"(simplejpeg decode, RandomResizedCrop 224, flip), {results['workers']} workers, batch 64, every batch made "
        "the normalised float the model takes. Each read is a fresh process: it times from making the dataset to "
        "the first batch, epoch 1 (start-up included) and epoch 2 on the same loader. S3: one moto server on "
        "127.0.0.1 that all three read. "
        f"{results['rounds']} interleaved rounds{cut} (ours, MosaicML, LitData, ...); the figures are medians and the "
        "ratios the median of each round's own ratio (in brackets), as speed ratios: above 1x the first named is "
        "faster.",
        "",
        *rows(results),
        "",
        "What is still not equal:",
        "",
        *[f"- {line}" for line in UNFAIRNESSES],
        "",
    ]
