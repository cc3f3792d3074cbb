"""TensorBoard event files of a run (rank 0): one point per epoch at the run's global step."""

from __future__ import annotations

from pathlib import Path

from imagenet_train.io.owned import owned_folder


class EpochEvents:
    """Writes an epoch's metrics record as TensorBoard scalars under RUN_DIR/tensorboard."""

    # metrics.jsonl key -> TensorBoard tag; keys an epoch lacks (no evaluation that epoch) are skipped.
    TAGS = {
        "train_loss": "train/loss",
        "lr": "train/lr",
        "train_samples": "train/samples",
        "samples_seen": "train/samples_seen",
        "val_loss": "val/loss",
        "top1": "val/top1",
        "top5": "val/top5",
        "ema_val_loss": "val/ema_loss",
        "ema_top1": "val/ema_top1",
        "ema_top5": "val/ema_top5",
        "samples_per_s": "perf/samples_per_s",
        "data_wait_fraction": "perf/data_wait_fraction",
        "epoch_time_s": "perf/epoch_time_s",
    }

    def __init__(self, run_dir: Path) -> None:
        from tensorboardX import SummaryWriter

        self.folder = owned_folder(Path(run_dir) / "tensorboard")  # 0700, ours: tensorboardX writes in it
        self.writer = SummaryWriter(str(self.folder), flush_secs=30)

    def write(self, record: dict, step: int) -> None:
        """Every known number in `record` at global step `step`, plus one curve per rank's batch count."""
        for key, tag in self.TAGS.items():
            if key in record:
                self.writer.add_scalar(tag, record[key], step)
        self.writer.add_scalar("train/epoch", record["epoch"], step)
        for rank, batches in enumerate(record.get("batches_per_rank", [])):
            self.writer.add_scalar(f"batches_per_rank/rank{rank}", batches, step)
        for rank, fraction in enumerate(record.get("data_wait_per_rank", [])):
            self.writer.add_scalar(f"data_wait_per_rank/rank{rank}", fraction, step)
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()
