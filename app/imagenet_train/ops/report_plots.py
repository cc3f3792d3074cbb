"""`report`'s PNGs: one function per plot, each drawing a bounded number of points on the axes it is given
(and the samples seen by each epoch's end, which the table shows too).

A run of many epochs (a metrics file of 150,000 records is 17 MB) is drawn as at most MAX_POINTS points per
curve: each point stands for a run of consecutive epochs and is their mean (the fewest and most batches on a
rank: their minimum and maximum; samples seen: the value at the run's end), so every record still counts.
Throughput is bars up to MAX_BARS epochs, a line beyond. A panel with nothing to draw says so in words.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from itertools import accumulate
from statistics import fmean

from imagenet_train.errors import ImagenetTrainError

MAX_POINTS = 400  # per curve: a 6.4-inch plot at 110 dpi is ~700 pixels wide
MAX_BARS = 60
MARKED = 60  # curves of more points than this are drawn without markers


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


def _last(values: Sequence[float]) -> float:
    return values[-1]


def reduced(pairs: Sequence[tuple[float, float]], combine: Callable = fmean, limit: int = MAX_POINTS) -> tuple:
    """(epochs, values) of `pairs`, at most `limit` of each: beyond it, each run of consecutive pairs becomes one
    point, its values combined by `combine` (fmean, min, max, or the last) at the run's mean (or last) epoch."""
    if len(pairs) <= limit:
        return [e for e, _ in pairs], [v for _, v in pairs]
    size = math.ceil(len(pairs) / limit)
    at = _last if combine is _last else fmean
    chunks = [pairs[start : start + size] for start in range(0, len(pairs), size)]
    return [at([e for e, _ in c]) for c in chunks], [combine([v for _, v in c]) for c in chunks]


def per_point(records: list[dict]) -> int:
    """How many epochs one point of a curve stands for (1 up to MAX_POINTS epochs)."""
    return math.ceil(len(records) / MAX_POINTS) if len(records) > MAX_POINTS else 1


def _series(records: list[dict], key: str, scale: float = 1.0, combine: Callable = fmean) -> tuple:
    return reduced([(r["epoch"], scale * r[key]) for r in records if key in r], combine)


def _marker(xs: Sequence, marker: str) -> str:
    return marker if len(xs) <= MARKED else ""


def _nothing(ax, title: str, why: str) -> None:
    """A panel with nothing to draw: its title and why, no axes (an empty plot's ticks would mean nothing)."""
    ax.set_title(title)
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_axis_off()


def plot_loss(ax, records: list[dict]) -> None:
    """Training and validation loss per epoch."""
    for key, marker, label in (("train_loss", "o", "train"), ("val_loss", "s", "validation")):
        xs, ys = _series(records, key)
        if xs:
            ax.plot(xs, ys, marker=_marker(xs, marker), label=label)
    ax.set(title="Loss (log scale)", xlabel="epoch", ylabel="cross-entropy", yscale="log")
    ax.legend()


def plot_accuracy(ax, records: list[dict]) -> None:
    """Validation top-1 and top-5 per epoch, in percent; the legend gives the last epoch's figures.

    In the legend, not beside the last points: a label there is hidden by the legend or the other curve."""
    if not any("top1" in r or "top5" in r for r in records):
        _nothing(ax, "Validation accuracy", "no validation in this run")
        return
    for key, marker in (("top1", "o"), ("top5", "s")):
        last = next((r for r in reversed(records) if key in r), None)
        if last is not None:
            xs, ys = _series(records, key, 100)
            label = f"{key.replace('top', 'top-')}: {100 * last[key]:.1f}% at epoch {last['epoch']}"
            ax.plot(xs, ys, marker=_marker(xs, marker), label=label)
    ax.set(title="Validation accuracy", xlabel="epoch", ylabel="%", ylim=(0, 102))
    ax.legend(loc="best")


def plot_learning_rate(ax, records: list[dict]) -> None:
    """The learning rate at each epoch's last step (metrics.jsonl's `lr`)."""
    xs, ys = _series(records, "lr")
    if not xs:
        _nothing(ax, "Learning rate", "not recorded in metrics.jsonl")
        return
    ax.plot(xs, ys, marker=_marker(xs, "o"), color="tab:red")
    ax.set(title="Learning rate (at each epoch's last step)", xlabel="epoch", ylabel="learning rate")


def plot_throughput(ax, records: list[dict]) -> None:
    """Training images per second per epoch (all ranks together): bars for a few epochs, a line for many."""
    xs, ys = _series(records, "samples_per_s")
    if not xs:
        _nothing(ax, "Throughput", "not recorded in metrics.jsonl")
        return
    if len(xs) <= MAX_BARS:
        ax.bar(xs, ys, color="tab:green")
    else:
        ax.plot(xs, ys, color="tab:green")
    ax.set(title="Throughput", xlabel="epoch", ylabel="images / s (all ranks)")


def plot_data_wait(ax, records: list[dict]) -> None:
    """Share of step time spent waiting for the next batch, per rank (up to 8) and on average."""
    key = "data_wait_per_rank"
    ranks = max((len(r.get(key, [])) for r in records), default=0)
    for rank in range(ranks if ranks <= 8 else 0):
        xs, ys = reduced([(r["epoch"], 100 * r[key][rank]) for r in records if rank < len(r.get(key, []))])
        ax.plot(xs, ys, linestyle="--", alpha=0.6, label=f"rank {rank}")
    xs, ys = _series(records, "data_wait_fraction", 100)
    if xs:
        ax.plot(xs, ys, marker=_marker(xs, "o"), color="black", label="mean")
    if not ax.lines:
        _nothing(ax, "Waiting for data", "not recorded in metrics.jsonl")
        return
    ax.set(title="Waiting for data", xlabel="epoch", ylabel="% of step time", ylim=(0, 100))
    ax.legend()


def plot_batch_spread(ax, records: list[dict]) -> None:
    """Batches each rank trained per epoch: equal in resampled mode, a spread in split/queue mode."""
    epochs, lows = reduced([(r["epoch"], min(r["batches_per_rank"])) for r in records], min)
    _, highs = reduced([(r["epoch"], max(r["batches_per_rank"])) for r in records], max)
    ax.vlines(epochs, lows, highs, color="tab:blue", linewidth=6 if len(epochs) <= MARKED else 1, alpha=0.4)
    ax.plot(epochs, highs, _marker(epochs, "v"), color="tab:blue", label="most batches on a rank")
    ax.plot(epochs, lows, _marker(epochs, "^"), color="tab:orange", label="fewest batches on a rank")
    ax.set_ylim(0, max(max(highs) * 1.25, 1))
    spread = max(max(r["batches_per_rank"]) - min(r["batches_per_rank"]) for r in records)
    ranks = max(len(r["batches_per_rank"]) for r in records)
    ax.set(title=f"Batches per rank ({ranks} ranks; largest spread {spread})", xlabel="epoch", ylabel="batches")
    ax.legend(loc="lower right")


def plot_samples_seen(ax, records: list[dict]) -> None:
    """Training samples seen so far, over all ranks."""
    pairs = list(zip((r["epoch"] for r in records), samples_seen(records), strict=True))
    xs, ys = reduced(pairs, _last)
    ax.plot(xs, ys, marker=_marker(xs, "o"), color="tab:purple")
    ax.set(title="Training samples seen", xlabel="epoch", ylabel="samples")


PLOTS: dict[str, Callable] = {
    "loss": plot_loss,
    "accuracy": plot_accuracy,
    "learning_rate": plot_learning_rate,
    "throughput": plot_throughput,
    "data_wait": plot_data_wait,
    "batches_per_rank": plot_batch_spread,
    "samples_seen": plot_samples_seen,
}


def overview_title(name: str, records: list[dict]) -> str:
    """The overview's title: the run's name, its epochs, and what a point stands for when it is several epochs."""
    count = len(records)
    title = f"{name}: {count} epoch{'' if count == 1 else 's'}"
    every = per_point(records)
    return title if every == 1 else f"{title} (each point: {every} epochs, their mean)"


def rendered(records: list[dict], name: str) -> dict[str, bytes]:
    """Each plot as PNG bytes by file name, and overview.png with all of them."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImagenetTrainError("report: needs matplotlib (pip install 'imagenet-train[report]')") from None
    pngs = {}
    for plot, draw in PLOTS.items():
        figure, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
        styled(ax, draw, records)
        pngs[f"{plot}.png"] = _png(figure, plt)
    columns = math.ceil(len(PLOTS) / 2)
    figure, axes = plt.subplots(2, columns, figsize=(5.3 * columns, 9), layout="constrained")
    for ax, draw in zip(axes.flat, PLOTS.values(), strict=False):
        styled(ax, draw, records)
    for ax in axes.flat[len(PLOTS) :]:
        ax.set_axis_off()
    figure.suptitle(overview_title(name, records))
    pngs["overview.png"] = _png(figure, plt)
    return pngs


def styled(ax, draw: Callable, records: list[dict]) -> None:
    """Draw one plot on `ax`, with whole epochs on the x axis and a grid."""
    from matplotlib.ticker import MaxNLocator

    draw(ax, records)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    low, high = ax.get_xlim()
    if high - low < 1.2:  # one epoch: matplotlib's ±5 % margin would give ticks of -0.045 to 0.045
        ax.set_xlim((low + high) / 2 - 0.6, (low + high) / 2 + 0.6)
    ax.grid(alpha=0.3)


def _png(figure, plt) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()
