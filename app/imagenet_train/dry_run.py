"""`train --print-config`: the settings a run would use (defaults, then `--config FILE`, then the flags) and what
they derive (world size, global batch, scaled LR, warmup, steps), as YAML that `--config` takes back. Pure: it
reads no data, imports no torch and starts no process group; steps that need the index's sample count are
'unknown until the index is read' (`imagenet-train plan` reads it)."""

from __future__ import annotations

import json
import os
from typing import Any

import yaml

from imagenet_train.choices import Mode
from imagenet_train.config import Config
from imagenet_train.planning.schedule import Schedule

UNKNOWN = "unknown until the index is read (imagenet-train plan --shards ... reads it)"


def launch_world() -> tuple[int, str]:
    """The world size the launcher gives (torchrun's WORLD_SIZE), else 1; and where it came from."""
    text = os.environ.get("WORLD_SIZE", "")
    if text.isdigit() and int(text) >= 1:
        return int(text), "WORLD_SIZE"
    return 1, "WORLD_SIZE unset: one process; under torchrun, --nnodes x --nproc-per-node"


def _samples(cfg: Config) -> int | None:
    """Training samples known without reading data: --train-samples with --train-urls; else None."""
    data = cfg.data
    return data.train_samples if data.train_urls and data.train_samples else None


def derived(cfg: Config, world: int, where: str) -> dict[str, Any]:
    """What a run of `cfg` on `world` ranks derives from its settings, before it reads any data."""
    run_cfg = cfg.for_world(world)  # --global-batch-size divided over the ranks (an error when it does not divide)
    data, loader = run_cfg.data, run_cfg.loader
    samples = _samples(run_cfg)
    schedule = Schedule.of(run_cfg, samples or 1, None, world)
    known = samples is not None
    return {
        "world_size": world,
        "world_size_from": where,
        "mode": Mode(loader.mode).value,
        "data": {
            "shards": data.shards or None,
            "train_urls": data.train_urls or None,
            "val_urls": data.val_urls or None,
            "train_samples": samples if known else UNKNOWN,
        },
        "batch_size": loader.batch_size,
        "global_batch": schedule.global_batch,
        "optimizer_batch": schedule.optimizer_batch,
        "base_lr": schedule.base_lr,
        "warmup_epochs": schedule.warmup,
        "epoch_batches": schedule.epoch_batches(0) if known else UNKNOWN,
        "epochs": schedule.epochs if known or not cfg.run.total_samples else UNKNOWN,
        "total_batches": schedule.total if known or cfg.run.total_samples else UNKNOWN,
    }


def resolved_yaml(cfg: Config, world: int, where: str) -> str:
    """The resolved settings by section and what they derive, as YAML (a `--config` file as it is)."""
    document = {**json.loads(cfg.to_json()), "derived": derived(cfg, world, where)}
    header = "# imagenet-train train --print-config: defaults, then --config, then flags; nothing was read or started\n"
    return header + yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=1 << 16)
