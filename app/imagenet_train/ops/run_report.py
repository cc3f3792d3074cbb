"""`imagenet-train report RUN_DIR`: PNG plots and a summary table from a run's metrics.jsonl."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path

from imagenet_train.errors import ImagenetTrainError, clip

MAX_FILE_BYTES = 64 << 20  # as run_record's MAX_METRICS_BYTES: a line per epoch, a few hundred bytes each
MAX_LINE_BYTES = 1 << 20  # an epoch record is a few hundred bytes, plus two short lists per 1000 ranks
MAX_COUNT = 1 << 62

# The fields the report reads, and what each must be. Records may carry more; those are not read.
_REQUIRED = {"epoch": "count", "train_loss": "number", "train_samples": "count", "batches_per_rank": "counts"}
_OPTIONAL = {
    "samples_per_s": "number",
    "val_loss": "number",
    "top1": "number",
    "top5": "number",
    "data_wait_fraction": "number",
    "data_wait_per_rank": "numbers",
    "samples_seen": "count",
    "resumed_from_step": "count",
}
_EXPECTED = {
    "count": "a whole number >= 0",
    "counts": "a non-empty list of whole numbers >= 0",
    "number": "a finite number >= 0",
    "numbers": "a list of finite numbers >= 0",
}


def read_records(run_dir: Path) -> list[dict]:
    """The run's epoch records, the last one of each epoch (a resumed run may repeat an epoch)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ImagenetTrainError(f"report: {path} not found (give a run directory written by `imagenet-train train`)")
    if path.stat().st_size > MAX_FILE_BYTES:  # every record is kept until the last of its epoch is known
        raise ImagenetTrainError(f"report: {path}: larger than {MAX_FILE_BYTES >> 20} MiB; not a metrics file of ours")
    by_epoch: dict[int, dict] = {}
    with open(path, "rb") as stream:
        for number, line in enumerate(iter(lambda: stream.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(line) > MAX_LINE_BYTES:
                raise ImagenetTrainError(f"report: {path} line {number}: longer than {MAX_LINE_BYTES} bytes")
            if line.strip():
                record = check_record(line, f"report: {path} line {number}")
                by_epoch[record["epoch"]] = record
    if not by_epoch:
        raise ImagenetTrainError(f"report: {path} holds no epochs yet")
    return [by_epoch[epoch] for epoch in sorted(by_epoch)]


def check_record(line: bytes, at: str) -> dict:
    """One metrics.jsonl line as a record whose fields the report reads are what it expects."""
    try:
        record = json.loads(line)  # NaN and Infinity become floats, refused below in the fields the report reads
    except (ValueError, RecursionError):
        raise ImagenetTrainError(f"{at}: expected a JSON object with 'epoch'") from None
    if not isinstance(record, dict) or "epoch" not in record:
        raise ImagenetTrainError(f"{at}: expected a JSON object with 'epoch'")
    for key, kind in (*_REQUIRED.items(), *_OPTIONAL.items()):
        if key not in record:
            if key in _REQUIRED:
                raise ImagenetTrainError(f"{at}: no '{key}'; expected {_EXPECTED[kind]}")
            continue
        value = record[key]
        fits = _fits(value, kind.rstrip("s")) if kind in ("count", "number") else _fits_list(value, kind)
        if not fits:
            raise ImagenetTrainError(f"{at}: field '{key}': expected {_EXPECTED[kind]}, got '{clip(value)}'")
    return record


def _fits(value: object, kind: str) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if kind == "count":
        return isinstance(value, int) and 0 <= value <= MAX_COUNT
    return math.isfinite(value) and 0 <= value <= MAX_COUNT


def _fits_list(value: object, kind: str) -> bool:
    if not isinstance(value, list) or (kind == "counts" and not value):
        return False
    return all(_fits(item, kind[:-1]) for item in value)


def samples_seen(records: list[dict]) -> list[int]:
    """Training samples seen by the end of each epoch, over all ranks."""
    if all("samples_seen" in r for r in records):
        return [int(r["samples_seen"]) for r in records]
    return list(accumulate(_epoch_samples(r) for r in records))


def _epoch_samples(record: dict) -> int:
    """Samples an epoch trained on, with the steps a resumed epoch took before its checkpoint."""
    samples, batches = int(record["train_samples"]), record["batches_per_rank"]
    before = record.get("resumed_from_step", 0)
    if before and sum(batches):
        samples += round(before * len(batches) * samples / sum(batches))
    return samples


# -- one function per plot: each draws on the axes it is given --------------------------------


def _epochs(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["epoch"], r[key]) for r in records if r.get(key) is not None]
    return [e for e, _ in pairs], [v for _, v in pairs]


def plot_loss(ax, records: list[dict]) -> None:
    """Training and validation loss per epoch."""
    ax.plot(*_epochs(records, "train_loss"), marker="o", label="train")
    if any("val_loss" in r for r in records):
        ax.plot(*_epochs(records, "val_loss"), marker="s", label="validation")
    ax.set(title="Loss (log scale)", xlabel="epoch", ylabel="cross-entropy", yscale="log")
    ax.legend()


def plot_accuracy(ax, records: list[dict]) -> None:
    """Validation top-1 and top-5 per epoch, in percent; the legend gives the last epoch's figures.

    In the legend, not beside the last points: a label there is hidden by the legend or the other curve."""
    for key, marker in (("top1", "o"), ("top5", "s")):
        epochs, values = _epochs(records, key)
        if epochs:
            label = f"{key.replace('top', 'top-')}: {100 * values[-1]:.1f}% at epoch {epochs[-1]}"
            ax.plot(epochs, [100 * v for v in values], marker=marker, label=label)
    ax.set(title="Validation accuracy", xlabel="epoch", ylabel="%", ylim=(0, 102))
    ax.legend(loc="best")


def plot_throughput(ax, records: list[dict]) -> None:
    """Training images per second per epoch (all ranks together)."""
    ax.bar(*_epochs(records, "samples_per_s"), color="tab:green")
    ax.set(title="Throughput", xlabel="epoch", ylabel="images / s (all ranks)")


def plot_data_wait(ax, records: list[dict]) -> None:
    """Share of step time spent waiting for the next batch, per rank and on average."""
    key = "data_wait_per_rank"
    ranks = max((len(r.get(key, [])) for r in records), default=0)
    for rank in range(ranks if ranks <= 8 else 0):
        points = [(r["epoch"], 100 * r["data_wait_per_rank"][rank]) for r in records if rank < len(r.get(key, []))]
        ax.plot(*zip(*points, strict=True), linestyle="--", alpha=0.6, label=f"rank {rank}")
    epochs, values = _epochs(records, "data_wait_fraction")
    ax.plot(epochs, [100 * v for v in values], marker="o", color="black", label="mean")
    ax.set(title="Waiting for data", xlabel="epoch", ylabel="% of step time", ylim=(0, 100))
    ax.legend()


def plot_batch_spread(ax, records: list[dict]) -> None:
    """Batches each rank trained per epoch: equal in resampled mode, a spread in split/queue mode."""
    epochs = [r["epoch"] for r in records]
    lows = [min(r["batches_per_rank"]) for r in records]
    highs = [max(r["batches_per_rank"]) for r in records]
    ax.vlines(epochs, lows, highs, color="tab:blue", linewidth=6, alpha=0.4)
    ax.plot(epochs, highs, "v", color="tab:blue", label="most batches on a rank")
    ax.plot(epochs, lows, "^", color="tab:orange", label="fewest batches on a rank")
    ax.set_ylim(0, max(highs) * 1.25)
    spread = max(h - lo for h, lo in zip(highs, lows, strict=True))
    ranks = max(len(r["batches_per_rank"]) for r in records)
    ax.set(title=f"Batches per rank ({ranks} ranks; largest spread {spread})", xlabel="epoch", ylabel="batches")
    ax.legend(loc="lower right")


def plot_samples_seen(ax, records: list[dict]) -> None:
    """Training samples seen so far, over all ranks."""
    epochs = [r["epoch"] for r in records]
    ax.plot(epochs, samples_seen(records), marker="o", color="tab:purple")
    ax.set(title="Training samples seen", xlabel="epoch", ylabel="samples")


PLOTS: dict[str, Callable] = {
    "loss": plot_loss,
    "accuracy": plot_accuracy,
    "throughput": plot_throughput,
    "data_wait": plot_data_wait,
    "batches_per_rank": plot_batch_spread,
    "samples_seen": plot_samples_seen,
}


def write_plots(records: list[dict], folder: Path) -> list[Path]:
    """One PNG per plot and an overview.png with all of them; returns the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImagenetTrainError("report: needs matplotlib (pip install 'imagenet-train[report]')") from None
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in PLOTS.items():
        figure, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
        _style(ax, draw, records)
        written.append(_save(figure, folder / f"{name}.png", plt))
    figure, axes = plt.subplots(2, 3, figsize=(16, 9), layout="constrained")
    for ax, draw in zip(axes.flat, PLOTS.values(), strict=True):
        _style(ax, draw, records)
    figure.suptitle(f"{folder.parent.name}: {len(records)} epochs")
    written.append(_save(figure, folder / "overview.png", plt))
    return written


def _style(ax, draw: Callable, records: list[dict]) -> None:
    from matplotlib.ticker import MaxNLocator

    draw(ax, records)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def _save(figure, path: Path, plt) -> Path:
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def summary_table(records: list[dict]) -> str:
    """A fixed-width table: one row per epoch."""
    header = ["epoch", "train loss", "val loss", "top-1", "top-5", "img/s", "data wait", "batches/rank", "seen"]
    rows = [header]
    for record, seen in zip(records, samples_seen(records), strict=True):
        batches = record["batches_per_rank"]
        rows.append(
            [
                str(record["epoch"]),
                f"{record['train_loss']:.4f}",
                f"{record['val_loss']:.4f}" if "val_loss" in record else "-",
                f"{100 * record['top1']:.2f}%" if "top1" in record else "-",
                f"{100 * record['top5']:.2f}%" if "top5" in record else "-",
                f"{record['samples_per_s']:.0f}" if "samples_per_s" in record else "-",
                f"{100 * record['data_wait_fraction']:.0f}%" if "data_wait_fraction" in record else "-",
                f"{min(batches)}" if min(batches) == max(batches) else f"{min(batches)}-{max(batches)}",
                str(seen),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)


def report(run_dir: Path) -> tuple[str, list[Path]]:
    """The summary table and the PNGs written under RUN_DIR/report."""
    records = read_records(run_dir)
    return summary_table(records), write_plots(records, Path(run_dir) / "report")
