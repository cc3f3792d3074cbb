"""`make bench`: run P1-P5 side by side on this machine and write docs/benchmarks.md (P6 runs only with a GPU).

python bench/benchmarks_page.py [--images 2600] [--workdir bench/.work] [--out docs/benchmarks.md]
python bench/benchmarks_page.py --only P1_P2 epochs   # re-measure those sections; the rest of docs/benchmarks.md stays

A whole run keeps the page's hand-written `## ` sections (those no part here writes) before "P6 on a GPU".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import convert  # noqa: E402
import decode_parts  # noqa: E402
import epochs  # noqa: E402
import first_batch  # noqa: E402
import httpread  # noqa: E402
import loader  # noqa: E402
import pages  # noqa: E402
import percore_table  # noqa: E402
import startup  # noqa: E402

from imagenet_train.datasets.convert import ShardOptions  # noqa: E402
from imagenet_train.datasets.convert import convert as make_shards  # noqa: E402

SECTIONS = ("P1_P2", "P3", "P4", "P5", "first_batch", "decode_parts", "epochs", "percore")
# What each section owns in docs/benchmarks.md: its table rows (by their first cell) and its own heading.
ROW_LABELS = {"P1_P2": ("P1", "P2"), "P3": ("P3",), "P4": ("P4",), "P5": ("P5",), "first_batch": ("P7",)}
HEADINGS = {
    "first_batch": first_batch.HEADING,
    "epochs": "## Epoch boundary",
    "P1_P2": "## Per-image cost",
    "decode_parts": "## Why the fused decoder",
    "percore": percore_table.HEADING,
}
P6_COMMAND = (
    "imagenet-train shards /data/imagenet /data/shards --workers 16\n"
    "imagenet-train serve /data/shards --port 8080 &\n"
    "U=http://127.0.0.1:8080/shards.json\n"
    "python bench/gpu.py --shards $U --workers 8 --synthetic      # ceiling + our CPU decode, 8 workers\n"
    "python bench/gpu.py --shards $U --workers 14\n"
    "python bench/gpu.py --shards $U --workers 8 --decoder dali\n"
    "python bench/gpu.py --shards $U --workers 8 --decoder dali --steps 30 --sync-check\n"
    "python bench/gpu.py --shards $U --workers 8 --compile         # torch.compile, opt-in"
)


def verdict(value: float, goal: float, higher_is_better: bool = True) -> str:
    met = value >= goal if higher_is_better else value <= goal
    return "met" if met else "**short**"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2600, help="ImageNet-like JPEGs to generate")
    parser.add_argument("--workdir", default="bench/.work")
    parser.add_argument("--out", default="docs/benchmarks.md")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved loader runs; the best counts")
    parser.add_argument("--before", default=epochs.BEFORE, help="git ref of the 'before' code for the epochs section")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="loader workers (default: cores)")
    parser.add_argument(
        "--only", nargs="+", choices=SECTIONS, help="measure these sections and replace just their part of --out"
    )
    parser.add_argument(
        "--wait-load", type=float, default=0, help="before each section, wait (up to 20 min) for a lower load average"
    )
    args = parser.parse_args()
    if args.only and not Path(args.out).exists():
        parser.error(f"--only updates an existing {args.out}; run without --only first")
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    began = time.time()
    images = common.imagenet_like(work / "images", args.images)
    shards = work / "shards"
    if not (shards / "shards.json").exists():
        make_shards(str(images), str(shards), ShardOptions(maxcount=200, workers=args.workers), progress=False)
    digits = work / "digit-shards"
    if not (digits / "shards.json").exists():
        from imagenet_train.datasets.digits import write_digits

        write_digits(work / "digits", size=32)
        make_shards(str(work / "digits"), str(digits), ShardOptions(maxcount=130), progress=False)
    results = {"machine": common.machine(), "images": args.images, "mean_jpeg_kb": common.mean_jpeg_bytes(images) / 1e3}
    measures = {
        "P1_P2": lambda: loader.run(images, shards, args.workers, args.repeats),
        "P3": lambda: httpread.run(shards),
        "P4": lambda: convert.run(images, work, args.workers),
        "P5": lambda: startup.run(images, work, args.workers),
        "first_batch": lambda: first_batch.run(
            shards, epochs.code_at(first_batch.BEFORE, work), args.workers, args.repeats
        ),
        "decode_parts": lambda: decode_parts.run(images),
        "epochs": lambda: epochs.run(digits, shards, work, args.workers, args.before),
        "percore": lambda: per_core(work, args.images),
    }
    for name in args.only or SECTIONS:
        print(f"{name} ...", flush=True)
        wait_for_load(args.wait_load)
        load = os.getloadavg()[0]
        results[name] = measures[name]()
        results[name]["load"] = [round(load, 2), round(os.getloadavg()[0], 2)]
        results[name]["date"] = datetime.date.today().isoformat()
        print(json.dumps(results[name]), flush=True)
    results["seconds"] = time.time() - began
    (work / "results.json").write_text(json.dumps(results, indent=1))
    old = Path(args.out).read_text() if Path(args.out).exists() else ""
    text = update(old, results, args) if args.only else render(results, args, old)
    Path(args.out).write_text(text)
    print(f"wrote {args.out} in {results['seconds']:.0f} s")


def per_core(work: Path, images: int) -> dict:
    """bench/percore.py's figures, run in a fresh process (its workers' forkserver preloads the decoders)."""
    command = [sys.executable, str(Path(__file__).with_name("percore.py")), "--workdir", str(work)]
    done = subprocess.run([*command, "--images", str(images)], stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def wait_for_load(below: float, patience: float = 1200) -> None:
    """Wait until the 1-minute load average is under `below` (0: do not wait), or `patience` seconds passed."""
    deadline = time.time() + patience
    while below and os.getloadavg()[0] >= below and time.time() < deadline:
        time.sleep(10)


def load_note(section: dict) -> str:
    """The 1-minute load average when a section's measuring began and ended."""
    start, end = section["load"]
    return f"load {start:.1f}-{end:.1f}"


P6_RESULTS = Path(__file__).resolve().parent / "results" / "p6-h100.jsonl"
TABLE_HEAD = ["| | measure | figure | goal | |", "|---|---|---|---|---|"]
# Measured once on a lent H100 (commit bcf0b17); re-run `python bench/vote_check.py` where a GPU is lent.
VOTE_ROW = (
    "| P6 | the per-step pre-emption vote (NCCL all-reduce of [signal, failed rank], pinned copies, read 2 steps "
    'later) under `set_sync_debug_mode("error")` between 4096² matmuls, H100 (`python bench/vote_check.py`) | '
    "passed: no host-device sync in 23 steps; a signal noted at step 20 was agreed at step 22 | no sync per step | "
    "met |"
)


def p1_p2_rows(p: dict) -> list[str]:
    """P1 against ImageFolder and against DALI's CPU pipeline, and P2, from one interleaved run."""
    w, load = p["workers"], load_note(p) if "load" in p else ""
    best = max(("simplejpeg", "fused"), key=lambda d: p[f"ours_{d}"])
    p1 = p[f"ours_{best}"] / p["baseline"]
    p2 = {d: p[f"ours_uint8_{d}"] / (p[f"bare_{d}"] * w) for d in ("simplejpeg", "fused")}
    rows = [
        f"| P1 | our loader ({best} decoder) / ImageFolder+DataLoader, {w} workers each, normalised float | "
        f"{p[f'ours_{best}']:.0f} / {p['baseline']:.0f} img/s = **{p1:.2f}x** "
        f"({rounds(p, f'ours_{best}', 'baseline')}; {load}) | >= 2.5x | {verdict(p1, 2.5)} |",
    ]
    if "dali_cpu" in p:
        for out, ours, dali in (("normalised float", "ours", "dali_cpu"), ("uint8", "ours_uint8", "dali_cpu_uint8")):
            ratio = p[f"{ours}_{best}"] / p[dali]
            rows.append(
                f"| P1 | our loader ({best}) / DALI's CPU pipeline (fn.readers.webdataset over the same shards, "
                f"{w} threads, same crop and flip), {out} | {p[f'{ours}_{best}']:.0f} / {p[dali]:.0f} img/s = "
                f"**{ratio:.2f}x** ({rounds(p, f'{ours}_{best}', dali)}; {load}) | peer | - |"
            )
    else:
        rows.append("| P1 | against DALI's CPU pipeline | not measured: NVIDIA DALI not installed | peer | - |")
    rows += [
        f"| P2 | loader (uint8 batches) / (bare decode+augment loop x {w} workers), simplejpeg | "
        f"{p['ours_uint8_simplejpeg']:.0f} / ({p['bare_simplejpeg']:.0f} x {w}) = **{p2['simplejpeg']:.0%}** "
        f"({load}) | >= 85% | {verdict(p2['simplejpeg'], 0.85)} |",
        f"| P2 | same, fused decoder | {p['ours_uint8_fused']:.0f} / ({p['bare_fused']:.0f} x {w}) = "
        f"**{p2['fused']:.0%}** ({load}) | >= 85% | {verdict(p2['fused'], 0.85)} |",
    ]
    return rows


def rounds(p: dict, numerator: str, denominator: str) -> str:
    """The ratio within each interleaved round, where both ran back to back under nearly the same load."""
    pairs = zip(p["runs"][numerator], p["runs"][denominator], strict=True)
    return "rounds: " + ", ".join(f"{a / b:.2f}x" for a, b in pairs)


def p3_rows(h: dict) -> list[str]:
    p3 = h["opener"] / h["curl"] if "opener" in h else float("nan")
    return [
        f"| P3 | loader's URL opener / curl, same shards from local nginx | {h.get('opener', 0) / 1e6:.0f} / "
        f"{h.get('curl', 0) / 1e6:.0f} MB/s = **{p3:.0%}** | >= 80% | {verdict(p3, 0.8)} |"
    ]


def p4_rows(c: dict, w: int) -> list[str]:
    p4, p4_full = c["tar"] / c[f"shards_header_{w}w"], c["tar"] / c[f"shards_full_{w}w"]
    rows = [
        f"| P4 | `tar` copy time / `shards --verify header` time, {w} workers | {c['tar']:.2f} s / "
        f"{c[f'shards_header_{w}w']:.2f} s = **{p4:.2f}x** | >= 0.8x | {verdict(p4, 0.8)} |",
        f"| P4 | same, `--verify full` (default: every image decoded) | {c['tar']:.2f} s / "
        f"{c[f'shards_full_{w}w']:.2f} s = **{p4_full:.2f}x** | >= 0.8x | {verdict(p4_full, 0.8)} |",
    ]
    for verify in ("full", "header") if w > 1 else ():
        ratio = c[f"shards_{verify}_1w"] / c[f"shards_{verify}_{w}w"]
        rows.append(
            f"| P4 | `--verify {verify}` speed-up, 1 -> {w} workers | {c[f'shards_{verify}_1w']:.2f} s -> "
            f"{c[f'shards_{verify}_{w}w']:.2f} s = **{ratio:.2f}x** | near {w}x | {verdict(ratio, 0.8 * w)} |"
        )
    return rows


def p5_rows(s: dict, w: int) -> list[str]:
    return [
        f"| P5 | process start to first batch, {s['shards']} shards listed (index over nginx), {w} workers | "
        f"**{s['seconds']:.1f} s** (median of {len(s['all'])}) | <= 10 s | {verdict(s['seconds'], 10, False)} |"
    ]


def per_image_block(p: dict) -> list[str]:
    return [
        "## Per-image cost (bare loops, one core)",
        "",
        f"From the P1/P2 run ({load_note(p)})." if "load" in p else "",
        "",
        "| decode + RandomResizedCrop + flip | img/s |",
        "|---|---|",
        f"| simplejpeg, crop the uint8 tensor (default) | {p['bare_simplejpeg']:.0f} |",
        f"| fused: header, crop box, lossless crop, DCT-scaled decode, resize | {p['bare_fused']:.0f} |",
        f"| PIL decode + v2 transforms + ToDtype/Normalize (the baseline's work) | "
        f"{p['bare_pil_baseline_transform']:.0f} |",
        "",
    ]


def decode_parts_block(parts: dict) -> list[str]:
    return [
        "## Why the fused decoder is not the default here",
        "",
        "Microseconds per benchmark JPEG for each step a fused crop decoder takes (libjpeg-turbo "
        "2.1.5 through PyTurboJPEG 1.8, one core):",
        "",
        "| step | us/image |",
        "|---|---|",
        *[f"| {name} | {us:.0f} |" for name, us in parts.items() if name not in ("load", "date")],
        "",
        "tjTransform's lossless crop entropy-decodes the whole image and re-encodes the crop, so it costs about "
        "one full decode; libjpeg-turbo has SIMD IDCTs only for 1/1, 1/2 and 1/4, so 5/8-7/8 scales decode "
        "slower than full size, and 1/2 never keeps a 224 crop of a 375-px side. At ~100 KB per image the "
        "Huffman decoding of every block dominates, and only partial decompression (libjpeg-turbo 3's "
        "tj3SetCroppingRegion, or jpeg_skip_scanlines) avoids it. `--decoder fused` stays available; "
        "simplejpeg (full decode, then the same crop on the uint8 tensor) is the default because it is faster.",
        "",
    ]


EPOCH_WORKLOADS = {
    "demo": "digits demo: resnet18, 32 px, batch 32, 3 epochs x 20 batches",
    "step224": "benchmark JPEGs: mobilenet_v3_small, 224 px, batch 64, 2 epochs x 10 batches",
}


def epochs_block(e: dict, machine: str) -> list[str]:
    """First-batch wait per epoch and host-side step overhead, before and after (bench/epochs.py)."""
    ref, w = e["before_ref"], e["workers"]
    lines = [
        "## Epoch boundary and host-side step overhead (CPU), before and after",
        "",
        f"Measured {e.get('date', '')} on {machine} by `python bench/benchmarks_page.py --only epochs --workers {w}` "
        "(part of `make bench`), which runs `bench/stepoverhead.py` (the trainer's own `train_epoch`, resampled "
        f"mode, {w} loader workers, one torch thread) with `PYTHONPATH` at the package of `{ref}` (before: main "
        "just before issue 16's input work) and at this tree (after), interleaved before/after/before/after; of "
        f"{e['repeats']} runs each, the one with the least host time per step counts. Load average: the 1-minute "
        "figure when each run began and ended (2 cores, shared with other jobs).",
        "",
        "First-batch wait: from calling `train_epoch` to having the epoch's first batch (epoch 0 includes "
        "starting the workers in both).",
        "",
        "| workload | | epoch 0 | epoch 1 | epoch 2 | later epochs' mean | before / after (later epochs) | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, title in EPOCH_WORKLOADS.items():
        before, after = e.get(f"{name}_before", {}), e.get(f"{name}_after", {})
        for when, x in (("before", before), ("after", after)):
            if "error" in x or not x:
                lines.append(f"| {title} | {when} | failed: {x.get('error', 'not run')} | | | | | |")
                continue
            waits = [*x["first_batch_s"], None, None][:3]
            cells = " | ".join("-" if v is None else f"{v:.2f} s" for v in waits)
            ratio = ""
            if when == "after" and "first_batch_s" in before:
                ratio = f"**{later(before) / later(x):.1f}x**"
            lines.append(f"| {title} | {when} | {cells} | {later(x):.2f} s | {ratio} | {load_pair(x)} |")
    lines += [
        "",
        "Host-side step overhead: per step, from one batch's hand-over to the next, the time outside the "
        "model's forward (with the loss) and backward: getting the next batch (waiting on the workers, and "
        "before this issue re-mixing and re-stacking them in the training process), the optimizer, and the "
        "rest (normalisation, LR, loss sum, progress bar, pre-emption vote). Means over every step whose next "
        "batch came in the same epoch.",
        "",
        "| workload | | step | forward + backward | **outside** | of which: next batch | optimizer | rest "
        "| before / after (outside) | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, title in EPOCH_WORKLOADS.items():
        before = e.get(f"{name}_before", {})
        for when in ("before", "after"):
            x = e.get(f"{name}_{when}", {})
            if "error" in x or not x:
                lines.append(f"| {title} | {when} | failed: {x.get('error', 'not run')} | | | | | | | |")
                continue
            ratio = ""
            if when == "after" and "outside_ms" in before:
                ratio = f"**{before['outside_ms'] / x['outside_ms']:.2f}x**"
            lines.append(
                f"| {title} | {when} | {x['step_ms']:.0f} ms | {x['forward_ms'] + x['backward_ms']:.0f} ms | "
                f"**{x['outside_ms']:.1f} ms** | {x['batch_wait_ms']:.1f} ms | {x['optimizer_ms']:.1f} ms | "
                f"{x['rest_ms']:.1f} ms | {ratio} | {load_pair(x)} |"
            )
    lines += ["", "Each run alone, either package on `PYTHONPATH`:", "", "```bash"]
    lines += [f"PYTHONPATH=app python {command}" for command in e["commands"].values()]
    lines += ["```", ""]
    return lines


def later(x: dict) -> float:
    """Mean first-batch wait of the epochs after the first."""
    waits = x["first_batch_s"][1:]
    return sum(waits) / max(len(waits), 1)


def load_pair(x: dict) -> str:
    return f"{x['load'][0]:.1f}-{x['load'][1]:.1f}" if "load" in x else ""


P6_HEADING = "## P6 on a GPU"


def p6_block() -> list[str]:
    return [
        P6_HEADING,
        "",
        "P6 ran on a lent NVIDIA H100 80GB HBM3 (16 cores); its raw figures: `bench/results/p6-h100.jsonl`. "
        "Data wait: share of wall time the training thread spent waiting for the next batch (for DALI this "
        "includes its GPU decode sharing the GPU). The commands (run where a GPU is lent):",
        "",
        "```bash",
        P6_COMMAND,
        "```",
        "",
    ]


def p6_runs() -> dict:
    """P6's figures by run name (bench/results/p6-h100.jsonl), the sync checks left out."""
    runs: dict = {}
    for line in P6_RESULTS.read_text().splitlines() if P6_RESULTS.exists() else []:
        for key, value in json.loads(line).items():
            if isinstance(value, dict) and "img_s" in value and "sync_check" not in value:
                runs[key] = value
    return runs


def p6_ceiling() -> float:
    """P6's ceiling (img/s at 224 px on one H100), or the figure it measured when its results are absent."""
    return p6_runs().get("synthetic", {}).get("img_s", percore_table.P6_CEILING)


def p6_rows() -> list[str]:
    """P6 from the figures a lent GPU produced (bench/results/p6-h100.jsonl), or the plain statement."""
    if not P6_RESULTS.exists():
        return [
            "| P6 | ResNet-50 bf16 channels_last b256, synthetic vs real shards | not run: no GPU was lent | "
            ">= 3,000 img/s; real >= 95% | - |"
        ]
    runs = p6_runs()
    ceiling = runs["synthetic"]["img_s"]
    rows = [
        f"| P6 | ResNet-50 bf16 channels_last b256 on one H100, trainer's step, fixed batch on the GPU (ceiling) | "
        f"**{ceiling:.0f} img/s** | >= 3,000 img/s | {verdict(ceiling, 3000)} |"
    ]
    names = {
        "simplejpeg_8w": "our CPU decode, 8 workers",
        "simplejpeg_14w": "our CPU decode, 14 workers",
        "dali_8w": "--decoder dali (nvJPEG, mixed), 8 reader workers",
    }
    for key, title in names.items():
        if key in runs:
            x = runs[key]
            rows.append(
                f"| P6 | same, real shards over nginx, {title} | {x['img_s']:.0f} img/s = "
                f"**{x['img_s'] / ceiling:.0%}** of the ceiling; data wait {x['data_wait']:.0%} of wall time "
                "| real >= 95% | "
                f"{verdict(x['img_s'] / ceiling, 0.95)} |"
            )
    checks = [
        f"{key.split('_')[0]}: {value['sync_check']}"
        for line in P6_RESULTS.read_text().splitlines()
        for key, value in json.loads(line).items()
        if isinstance(value, dict) and "sync_check" in value
    ]
    if checks:
        rows.append(
            '| P6 | sync check: timed steps under `torch.cuda.set_sync_debug_mode("error")` (batch hand-over, '
            f"copy, `Trainer.step`) | {'; '.join(checks)} | no sync per step | met |"
        )
    return [*rows, VOTE_ROW]


def section_rows(r: dict) -> dict[str, list[str]]:
    """The table rows of each section measured in `r`."""
    builders = {
        "P1_P2": lambda x: p1_p2_rows(x),
        "P3": lambda x: p3_rows(x),
        "P4": lambda x: p4_rows(x, r["P1_P2"]["workers"] if "P1_P2" in r else 2),
        "P5": lambda x: p5_rows(x, r["P1_P2"]["workers"] if "P1_P2" in r else 2),
        "first_batch": first_batch.rows,
    }
    return {name: build(r[name]) for name, build in builders.items() if name in r}


def section_blocks(r: dict) -> dict[str, list[str]]:
    """The `## ` blocks of each section measured in `r`."""
    builders = {
        "P1_P2": per_image_block,
        "first_batch": lambda x: first_batch.block(x, r["machine"]),
        "decode_parts": decode_parts_block,
        "epochs": lambda x: epochs_block(x, r["machine"]),
        "percore": lambda x: percore_table.block(x, r["machine"], p6_ceiling()),
    }
    return {name: build(r[name]) for name, build in builders.items() if name in r}


def render(r: dict, args, old: str = "") -> str:
    """The whole of docs/benchmarks.md from a run of every section, keeping `old`'s hand-written sections."""
    rows, blocks = section_rows(r), section_blocks(r)
    today = datetime.date.today().isoformat()
    lines = [
        "# Benchmarks",
        "",
        f"Measured {today} on: {r['machine']}. Command: `make bench` "
        f"(`python bench/benchmarks_page.py --images {r['images']} --workers {r['P1_P2']['workers']}`), "
        f"{r['seconds']:.0f} s in all.",
        f"Data: {r['images']} ImageNet-like JPEGs, 500x375 at quality 90, mean {r['mean_jpeg_kb']:.0f} KB "
        "(scikit-learn's two sample photos, randomly cropped, flipped, colour-shifted and grained to ImageNet's "
        "compressed size). Every ratio is of two figures measured one after the other in the same run; absolute "
        "rates on this shared machine drift, ratios much less; loader figures are the best of "
        f"{r['P1_P2']['repeats']} interleaved runs (rounds: the ratio within each run).",
        "",
        *TABLE_HEAD,
        *[row for name in ROW_LABELS for row in rows[name]],
        *p6_rows(),
        "",
        *[line for name in HEADINGS for line in blocks[name]],
        *pages.hand_written(old, [*HEADINGS.values(), P6_HEADING]),
        *p6_block(),
    ]
    return "\n".join(lines)


def update(old: str, r: dict, args) -> str:
    """`old` docs/benchmarks.md with the rows and blocks of the sections in `r` replaced, and a line saying what was
    re-measured when; everything else (P6 included) is kept as it was."""
    rows, blocks = section_rows(r), section_blocks(r)
    owner = {f"| {label} |": name for name, labels in ROW_LABELS.items() if name in rows for label in labels}
    lines, placed = [], set()
    for line in old.splitlines():
        name = next((n for prefix, n in owner.items() if line.startswith(prefix)), None)
        if name is None:
            lines.append(line)
        elif name not in placed:  # the section's new rows where its first old row was
            lines += rows[name]
            placed.add(name)
    missing = [row for name in ROW_LABELS if name in rows and name not in placed for row in rows[name]]
    if missing:  # after the last row of the page's first table (later tables have rows named P6 too)
        at = lines.index(TABLE_HEAD[1]) + 1
        while at < len(lines) and lines[at].startswith("| "):
            at += 1
        lines[at:at] = missing
    text = "\n".join(lines)
    for name, block in blocks.items():
        start = text.find(HEADINGS[name])
        new = "\n".join(block)
        if start < 0:
            text = text.rstrip("\n") + "\n\n" + new
            continue
        end = text.find("\n## ", start + 1)
        text = text[:start] + new + ("\n" + text[end + 1 :] if end >= 0 else "")
    head, table = text.split("\n" + TABLE_HEAD[0], 1)
    loads = "; ".join(f"{name} {load_note(r[name])}" for name in args.only)
    note = (
        f"{REMEASURED} {datetime.date.today().isoformat()}: {', '.join(args.only)}, with "
        f"`python bench/benchmarks_page.py --only {' '.join(args.only)} --workers {args.workers}` "
        f"({r['seconds']:.0f} s; 1-minute load average at start-end of each: {loads})."
    )
    kept = [line for line in head.rstrip("\n").splitlines() if not superseded(line, args.only)]
    return "\n".join([*kept, note, ""]) + "\n" + TABLE_HEAD[0] + table.rstrip("\n") + "\n"


REMEASURED = "Re-measured"


def superseded(line: str, sections: list[str]) -> bool:
    """Whether a header line is an earlier re-measure note of nothing but `sections`."""
    if not line.startswith(REMEASURED):
        return False
    named = line.split(": ", 1)[1].split(", with", 1)[0].split(", ")
    return set(named) <= set(sections)


if __name__ == "__main__":
    main()
