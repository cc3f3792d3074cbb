"""What a run writes about itself in its run directory (rank 0): config.json with the derived values,
one metrics.jsonl line and one summary line per epoch, and the TensorBoard events.

metrics.jsonl holds whole lines only (each write replaces the file atomically), one per epoch up to the newest
checkpoint: the line is written before its epoch's checkpoint, and a resume drops the lines of the epochs it
is about to train again, so a kill between the two neither loses an epoch's line nor repeats it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import torch

from imagenet_train.config import AugmentConfig, Config
from imagenet_train.datasets.source import DataSource
from imagenet_train.errors import ImagenetTrainError, clip
from imagenet_train.io.atomic import atomic_write
from imagenet_train.io.owned import owned_folder
from imagenet_train.planning.schedule import Schedule
from imagenet_train.redact import redact
from imagenet_train.rundir.events import EpochEvents

METRICS = "metrics.jsonl"
MAX_METRICS_BYTES = 64 << 20  # a line per epoch is a few hundred bytes; a bigger file is not one we wrote


# What this module needs of training/'s DistInfo (rundir/ sits below training/) and of a tracker's run.
class RankPlacement(Protocol):
    """Where this rank runs: the world size and its device (training.dist.DistInfo). Read-only members, so that
    the frozen DistInfo satisfies them."""

    @property
    def world(self) -> int:
        """How many ranks the run has."""
        ...

    @property
    def device(self) -> torch.device:
        """This rank's device."""
        ...


class TrackerRun(Protocol):
    """An experiment tracker's run (rundir.trackers.TrackerSink, or a test's own)."""

    def begin(self, resolved: dict) -> None:
        """Open the tracker run with the resolved settings."""

    def epoch(self, record: dict) -> None:
        """Send one epoch's numbers."""

    def close(self) -> None:
        """End the tracker run."""


def write_config(run_dir: Path, config_json: str, derived: dict[str, Any]) -> dict[str, Any]:
    """config.json: every setting as the run resolved it, plus what it derived (world size, LR, epochs...);
    returns what it wrote."""
    resolved = json.loads(config_json)
    resolved["derived"] = derived
    # Replaced by rename, 0600, in a folder of ours: a link planted at config.json is replaced, never written through.
    with atomic_write(owned_folder(run_dir) / "config.json", "w", private=True) as stream:
        stream.write(json.dumps(resolved, indent=1) + "\n")
    return resolved


def derived(
    info: RankPlacement,
    schedule: Schedule,
    source: DataSource,
    amp: torch.dtype | None,
    epoch: int,
    augment: AugmentConfig | None = None,
) -> dict:
    """What a run derived from its settings (`augment`: its augmentation section) and its launch, for config.json."""
    return {
        **({} if augment is None else {"val_crop_size": augment.eval_crop_size()}),  # 0 resolved to the train crop
        "world_size": info.world,
        "global_batch": schedule.global_batch,
        "optimizer_batch": schedule.optimizer_batch,
        "base_lr": schedule.base_lr,
        "train_shards": len(source.train_urls),
        "val_shards": len(source.val_urls),
        "train_samples": source.train_samples,
        "num_classes": source.num_classes,
        "epoch_batches": schedule.epoch_batches(epoch),
        "epochs": schedule.epochs,
        "total_batches": schedule.total,
        "warmup_epochs": schedule.warmup,
        "device": str(info.device),
        "amp": str(amp),
    }


def startup_line(cfg: Config, derived: dict[str, Any]) -> str:
    """Rank 0's first line: world size, global batch, peak LR, mode and data, and the run's length in steps."""
    data, mode = cfg.data, cfg.loader.mode
    where = clip(redact(data.shards or data.train_urls), 120)  # the one redaction: user info and signed values
    per_rank = derived["global_batch"] // max(1, derived["world_size"])
    return (
        f"training: world size {derived['world_size']}, global batch {derived['optimizer_batch']:,} ({per_rank:,} per "
        f"rank), peak LR {derived['base_lr']:.6g}, mode {getattr(mode, 'value', mode)}; data {where} "
        f"({derived['train_samples']:,} samples in {derived['train_shards']} shards, {derived['num_classes']} "
        f"classes); {derived['epochs']} epochs of {derived['epoch_batches']:,} steps, {derived['total_batches']:,} "
        f"in all; {derived['device']}, amp {'off' if derived['amp'] == 'None' else derived['amp']}"
    )


class EpochRecords:
    """Rank 0's record of the run: config.json, and each epoch's metrics.jsonl line, summary line on stdout,
    TensorBoard scalars and --tracker metrics."""

    def __init__(self, run_dir: Path, tensorboard: bool, tracker: TrackerRun | None = None):
        self.run_dir, self.tracker = run_dir, tracker
        self.events = EpochEvents(run_dir) if tensorboard else None

    def begin(self, config_json: str, derived: dict[str, Any]) -> None:
        """The run starts (or resumes): write config.json and open the tracker run with the same settings."""
        resolved = write_config(self.run_dir, config_json, derived)
        if self.tracker:
            self.tracker.begin(resolved)

    def write(self, record: dict, global_step: int) -> None:
        """Record one epoch's metrics, `global_step` steps into the run."""
        path = self.run_dir / METRICS
        lines = epoch_lines(path)
        lines[record["epoch"]] = json.dumps(record).encode() + b"\n"
        write_lines(path, lines)
        print(summary(record), flush=True)
        if self.events:
            self.events.write(record, global_step)
        if self.tracker:
            self.tracker.epoch(record)

    def keep_before(self, epoch: int) -> None:
        """A resume at `epoch`: drop the lines of that epoch and later, which the run trains again."""
        path = self.run_dir / METRICS
        if path.is_file():
            write_lines(path, {e: line for e, line in epoch_lines(path).items() if e < epoch})

    def close(self) -> None:
        """Flush and close the event files; the tracker run gets the final checkpoint's location and ends."""
        if self.events:
            self.events.close()
        if self.tracker:
            self.tracker.close()


def epoch_lines(path: Path) -> dict[int, bytes]:
    """metrics.jsonl's lines by epoch ({} when there is no file); the last line of an epoch wins."""
    if not path.is_file():
        return {}
    if path.stat().st_size > MAX_METRICS_BYTES:
        raise ImagenetTrainError(f"{path}: larger than {MAX_METRICS_BYTES >> 20} MiB; not a metrics file of ours")
    lines: dict[int, bytes] = {}
    for number, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
        try:
            epoch = json.loads(line)["epoch"] if line.strip() else None
        except (ValueError, TypeError, KeyError, RecursionError):
            epoch = ""
        if epoch is None:
            continue
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ImagenetTrainError(f"{path} line {number}: expected a JSON object with a whole-number 'epoch'")
        lines[epoch] = line if line.endswith(b"\n") else line + b"\n"
    return lines


def write_lines(path: Path, lines: dict[int, bytes]) -> None:
    """Replace metrics.jsonl, in one step, with these lines in epoch order."""
    with atomic_write(path, private=True) as stream:
        stream.write(b"".join(lines[epoch] for epoch in sorted(lines)))


def merge_fetched(path: Path, local: dict[int, bytes]) -> None:
    """After a resume fetched metrics.jsonl from the bucket over `local` (this node's lines before the fetch):
    every epoch either copy holds. The bucket lags this node's own writes, and this node's copy can be older
    than the bucket's when rank 0 ran elsewhere meanwhile; neither may lose the other's lines."""
    if local:
        write_lines(path, {**epoch_lines(path), **local})


def summary(record: dict) -> str:
    """One line of an epoch's record for the log: loss, top-1, throughput, damage met."""
    parts = [f"epoch {record['epoch']}", f"loss {record['train_loss']:.4f}"]
    if "top1" in record:
        parts.append(f"top1 {record['top1']:.4f}")
    if "ema_top1" in record:
        parts.append(f"EMA top1 {record['ema_top1']:.4f}")
    parts += [f"{record['samples_per_s']:.0f} img/s", f"{record['epoch_time_s']:.1f}s"]
    if record["corrupt_samples"]:
        parts.append(f"{record['corrupt_samples']} corrupt samples skipped")
    if record["broken_shards"]:
        parts.append(f"{record['broken_shards']} broken shards ({record['lost_samples']} samples lost)")
    return " | ".join(parts)
