"""`imagenet-train report RUN_DIR`: PNG plots and a summary table from a run's metrics.jsonl.

The plots go to RUN_DIR/report, which may come from elsewhere (a results folder copied or unpacked): the folder
is used only when it is a directory of this user that no one else may write to, and each PNG is a new file
renamed into it, so a link there is never written through (io/atomic.py's own_folder and replace_in)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from imagenet_train.errors import ImagenetTrainError, clip
from imagenet_train.io.atomic import own_folder, replace_in
from imagenet_train.ops.report_plots import rendered, samples_seen

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
    "lr": "number",
}
_READ = (*_REQUIRED, *_OPTIONAL)
_EXPECTED = {
    "count": "a whole number >= 0",
    "counts": "a non-empty list of whole numbers >= 0",
    "number": "a finite number >= 0",
    "numbers": "a list of finite numbers >= 0",
}


MAX_TABLE_ROWS = 50  # the table's first and last epochs; metrics.jsonl holds every one
HEAD_ROWS = 10
_STEP_CHECKPOINT = re.compile(r"^epoch-(\d{4,})-step-(\d{6,})\.pt$")  # rundir/checkpoint.py's (which needs torch)


def read_records(run_dir: Path) -> list[dict]:
    """The run's epoch records, the last one of each epoch (a resumed run may repeat an epoch), each with only
    the fields the report reads."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ImagenetTrainError(f"report: {path} not found ({_what_is_there(Path(run_dir))})")
    if path.stat().st_size > MAX_FILE_BYTES:  # every record is kept until the last of its epoch is known
        raise ImagenetTrainError(f"report: {path}: larger than {MAX_FILE_BYTES >> 20} MiB; not a metrics file of ours")
    by_epoch: dict[int, dict] = {}
    with open(path, "rb") as stream:
        for number, line in enumerate(iter(lambda: stream.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(line) > MAX_LINE_BYTES:
                raise ImagenetTrainError(f"report: {path} line {number}: longer than {MAX_LINE_BYTES} bytes")
            if line.strip():
                record = check_record(line, f"report: {path} line {number}")
                by_epoch[record["epoch"]] = {key: record[key] for key in _READ if key in record}
    if not by_epoch:
        raise ImagenetTrainError(f"report: {path} holds no epochs yet ({_what_is_there(Path(run_dir))})")
    return [by_epoch[epoch] for epoch in sorted(by_epoch)]


def _what_is_there(run_dir: Path) -> str:
    """What a run directory without a finished epoch holds: whether `train` wrote it, and what it can resume."""
    if not (run_dir / "config.json").is_file():
        return "give a run directory written by `imagenet-train train`"
    newest = _newest_step_checkpoint(run_dir / "checkpoints")
    if newest is None:
        return "config.json only: no epoch finished yet and no checkpoint, nothing to resume; train it again"
    name, epoch, step = newest
    return (
        f"no epoch finished yet: {step} steps of epoch {epoch} logged, checkpoint {name}; "
        "`train --resume latest` continues it"
    )


def _newest_step_checkpoint(folder: Path) -> tuple[str, int, int] | None:
    """The newest mid-epoch checkpoint's name, epoch and step in `folder` (None when there is none)."""
    newest = None
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                match = _STEP_CHECKPOINT.match(entry.name)
                if match:
                    found = (int(match[1]), int(match[2]), entry.name)
                    newest = max(newest, found) if newest else found
    except OSError:
        return None
    return None if newest is None else (newest[2], newest[0], newest[1])


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


def summary_table(records: list[dict]) -> str:
    """A fixed-width table: one row per epoch, the first and last ones of a run of more than MAX_TABLE_ROWS."""
    header = ["epoch", "train loss", "val loss", "top-1", "top-5", "img/s", "data wait", "batches/rank", "seen"]
    rows = [header]
    shown = list(zip(records, samples_seen(records), strict=True))
    left_out = len(shown) - MAX_TABLE_ROWS
    if left_out > 0:
        shown = shown[:HEAD_ROWS] + shown[HEAD_ROWS + left_out :]
    for record, seen in shown:
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
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    if left_out > 0:
        lines.insert(1 + HEAD_ROWS, f"... {left_out} epochs not shown (metrics.jsonl holds every one)")
    return "\n".join(lines)


def write_plots(records: list[dict], folder: Path) -> list[Path]:
    """The PNGs in `folder` (made if absent; refused unless this user's and closed to others); the files written."""
    handle = own_folder(folder, "report:")  # refused before the drawing, not after
    try:
        pngs = rendered(records, folder.resolve().parent.name)
        for name, data in pngs.items():
            replace_in(handle, name, data)
    except OSError as error:
        raise ImagenetTrainError(f"report: {folder}: cannot write the plots ({error.strerror})") from None
    finally:
        os.close(handle)
    return [folder / name for name in pngs]


def report(run_dir: Path) -> tuple[str, list[Path]]:
    """The summary table and the PNGs written under RUN_DIR/report."""
    records = read_records(run_dir)
    return summary_table(records), write_plots(records, Path(run_dir) / "report")
