"""The per-core loader section of docs/benchmarks.md, from bench/percore.py's figures (pure: no I/O, no torch)."""

from __future__ import annotations

import statistics

HEADING = "## Loader images/s per core at 160, 192 and 224 px"
CROPS = (160, 192, 224)
LARGE_SIDES = (375, 1200)  # short sides of the large full-size set (4:3, log-uniform)
RESIZES = (320, 256)  # `imagenet-train shards --resize N` of the standard set
KINDS = {
    "full": "full-size 500x375",
    "large": f"full-size, short side {LARGE_SIDES[0]}-{LARGE_SIDES[1]}",
    **{f"resize{n}": f"`--resize {n}` ({round(n * 4 / 3)}x{n})" for n in RESIZES},
}
P6_CEILING = 3949.0  # img/s: ResNet-50 bf16 on one H100 at 224 px, the trainer's step on a batch already there


def configurations(decoders: list[str]) -> list[tuple[int, str, str]]:
    """(crop, kind, decoder) of every configuration, in table order."""
    return [(crop, kind, decoder) for crop in CROPS for kind in KINDS for decoder in decoders]


def key(crop: int, kind: str, decoder: str) -> str:
    """A configuration's name in the results."""
    return f"{crop}/{kind}/{decoder}"


def cores_to_feed(gpu_rate: float, per_core: float) -> float:
    """Loader cores (one worker each) that keep up with a GPU taking `gpu_rate` img/s."""
    return gpu_rate / per_core if per_core > 0 else float("inf")


def spread(values: list[float]) -> str:
    """The range of the per-round figures around their median, in percent: '-4%/+7%'."""
    middle = statistics.median(values)
    return f"-{(middle - min(values)) / middle:.0%}/+{(max(values) - middle) / middle:.0%}"


def block(p: dict, machine: str, ceiling: float = P6_CEILING) -> list[str]:
    """The section: how it was measured, the table, and how to read the cores column."""
    loads = p["round_loads"]
    start, end = p.get("load", [loads[0], loads[-1]])
    share = statistics.median(
        w / c for name in p["runs"] for w, c in zip(p["wall"][name], p["runs"][name], strict=True)
    )
    lines = [
        HEADING,
        "",
        f"Measured {p.get('date', '')} on {machine} by `python bench/benchmarks_page.py --only percore` (part of "
        f"`make bench`; it runs `python bench/percore.py --rounds {p['rounds']} --seconds {p['seconds']:g}` in a "
        f"fresh process: {p['measure_s']} s measuring, {p['setup_s']} s for the shard sets, which are made once "
        "under bench/.work, ~2 minutes the first time here). "
        f"1-minute load average {start:.1f} at the start and {end:.1f} at the end; before each round "
        f"{', '.join(f'{v:.1f}' for v in loads[:-1])} (2 cores, shared with other jobs: absolute rates drift with "
        "it, so each configuration ran once per round, rounds interleaved, and the table gives every round).",
        "",
        "One core is one DataLoader worker: the trainer's own loader (EpochLoader over a ShardStream, resampled "
        "mode as in training, sizes and sha256 checked) with `--workers 1`, RandomResizedCrop to the crop size "
        f"and a flip, uint8 batches of {p['batch']} (training normalises them on the GPU). A figure is images "
        "per CPU-second of that worker process (its user + system time, from /proc), from its second batch on "
        f"until it had used {p['seconds']:g} s of CPU: on this loaded machine the worker got about "
        f"{share:.0%} of a core (its wall-clock rates are in `bench/.work/results.json`), and a CPU-second is "
        "what a core of its own gives. Other tenants still slow a CPU-second down (shared caches and memory), "
        "so these are lower bounds: on a quiet day the same loader gave 1,206-1,279 img/s from 2 workers at "
        "224 px on the standard set (the section on issue 21's checks), 600-640 a worker. The training process spent "
        f"{p['receive_ms'] * 1e3:.0f} us of CPU per image receiving the batches (not counted). Shards:",
        "",
        f"- **full-size 500x375**: the bench's standard set ({p['sample_kb']['full']:.0f} kB a sample). It "
        "stands for a typical ImageNet training image, with somewhat more pixels than the average (ImageNet's "
        "train images average roughly 400x350 px; its train tar, 147.9 GB for 1,281,167 images, ~115 kB an "
        "image).",
        f"- **full-size, short side {LARGE_SIDES[0]}-{LARGE_SIDES[1]}**: the same kind of image at 4:3 with the "
        "short side drawn log-uniformly in that range, the same grain per pixel "
        f"({p['sample_kb']['large']:.0f} kB a sample). It stands for camera-size photos: ImageNet's large "
        "minority, or a dataset of your own that was never downsized. Heavier than ImageNet's mix: its worst "
        "case.",
        *[
            f"- **`--resize {n}`**: `imagenet-train shards --resize {n}` of the standard set: every image whose "
            f"short side is above {n} px re-encoded at {n} px, quality 90 ({p['sample_kb'][f'resize{n}']:.0f} kB "
            "a sample). What any set written with it costs to load, whatever the originals' size."
            for n in RESIZES
        ],
        "",
        f"| crop | shards | decoder | img/s per core (median) | rounds 1-{p['rounds']} | spread | "
        f"cores to feed {ceiling:,.0f} img/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for crop, kind, decoder in configurations(p["decoders"]):
        name = key(crop, kind, decoder)
        rate, runs = p["median"][name], p["runs"][name]
        lines.append(
            f"| {crop} px | {KINDS[kind]} | {decoder} | **{rate:.0f}** | {', '.join(f'{v:.0f}' for v in runs)} | "
            f"{spread(runs)} | {cores_to_feed(ceiling, rate):.1f} |"
        )
    lines += [
        "",
        f"Cores to feed a GPU = (the GPU's img/s at that crop) / (img/s per core). The last column uses "
        f"{ceiling:,.0f} img/s at every crop: P6's ceiling, ResNet-50 bf16 channels_last on one H100 at 224 px "
        "(table above). **The GPU's rate at 160 and 192 px was not measured here** (no GPU was lent to this "
        "work), so the 160 and 192 px rows scale only our per-core rate against the 224 px ceiling. A GPU step "
        "at 160 px is faster: FFCV reports 1.5-2x faster steps at low resolution (their figure, not ours), so "
        "multiply those rows by the speed-up your GPU shows (2x at 160 px doubles the cores).",
        "",
        *reading(p, ceiling),
        "",
        "The per-core rate is this machine's; a server core can be faster (P6's runs on the H100's host fed "
        "2,354 img/s from 8 workers at 224 px, and 3,939 img/s, the GPU's ceiling, in another: 294 and at least "
        "492 img/s a worker, on its own data). Run `python bench/percore.py` on the training hosts to count "
        "their cores.",
        "",
    ]
    return lines


def reading(p: dict, ceiling: float) -> list[str]:
    """What the table says for a recipe that trains at 160 px and ends at 224 px, with the default decoder."""
    rate = {(crop, kind): p["median"][key(crop, kind, "simplejpeg")] for crop in CROPS for kind in KINDS}
    low = RESIZES[-1]

    def cores(crop: int, kind: str, speedup: float = 1.0) -> float:
        return cores_to_feed(ceiling * speedup, rate[(crop, kind)])

    fused = [key(c, k, "fused") for c in CROPS for k in KINDS if "fused" in p["decoders"]]
    slower = sum(p["median"][name] < p["median"][name.replace("fused", "simplejpeg")] for name in fused)
    return [
        f"Reading it (simplejpeg, the default): from full-size shards one H100 at P6's rate needs "
        f"{cores(224, 'full'):.1f} cores at 224 px. At 160 px the smaller crop saves little CPU, "
        f"{1 - rate[(224, 'full')] / rate[(160, 'full')]:.0%} per image, because decoding the whole image "
        "dominates; so if the GPU steps 1.5-2x faster there (FFCV's figure), it needs "
        f"{cores(160, 'full', 1.5):.1f}-{cores(160, 'full', 2):.1f} cores from full-size shards, or "
        f"{cores(160, f'resize{low}', 1.5):.1f}-{cores(160, f'resize{low}', 2):.1f} from `--resize {low}` shards "
        f"({cores(224, f'resize{low}'):.1f} at 224 px). Shards of camera-size photos need "
        f"{cores(224, 'large'):.0f} cores at 224 px. `--resize {low}` still holds a 224-px train crop and "
        f"torchvision's evaluation (resize 256, crop 224); an evaluation resized above {low} px would upsample "
        f"them, `--resize {RESIZES[0]}` leaves room for it. The fused decoder is slower than simplejpeg in "
        f"{slower} of {len(fused)} rows (see Why the fused decoder is not the default).",
    ]
