"""What a run writes about itself in its run directory (rank 0): config.json with the derived values,
one metrics.jsonl line and one summary line per epoch, and the TensorBoard events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from imagenet_train.datasets.source import DataSource
from imagenet_train.planning.schedule import Schedule
from imagenet_train.training.dist import DistInfo
from imagenet_train.training.events import EpochEvents


def write_config(run_dir: Path, config_json: str, derived: dict[str, Any]) -> None:
    """config.json: every setting as the run resolved it, plus what it derived (world size, LR, epochs...)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = json.loads(config_json)
    resolved["derived"] = derived
    (run_dir / "config.json").write_text(json.dumps(resolved, indent=1) + "\n")


def derived(info: DistInfo, schedule: Schedule, source: DataSource, amp: torch.dtype | None, epoch: int) -> dict:
    """What a run derived from its settings and its launch, for config.json."""
    return {
        "world_size": info.world,
        "global_batch": schedule.global_batch,
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


class EpochRecords:
    """Rank 0's record of each epoch: a metrics.jsonl line, a summary line on stdout, TensorBoard scalars."""

    def __init__(self, run_dir: Path, tensorboard: bool):
        self.run_dir = run_dir
        self.events = EpochEvents(run_dir) if tensorboard else None

    def write(self, record: dict, global_step: int) -> None:
        """Record one epoch's metrics, `global_step` steps into the run."""
        with open(self.run_dir / "metrics.jsonl", "a") as stream:
            stream.write(json.dumps(record) + "\n")
        print(summary(record), flush=True)
        if self.events:
            self.events.write(record, global_step)

    def close(self) -> None:
        """Flush and close the event files."""
        if self.events:
            self.events.close()


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
