"""A run's directory as the trainer uses it: the checkpoints with the state they restore, the epoch records and
their experiment tracker (rank 0), the key logs of the samples already read, and the mirror to --results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from imagenet_train.config import Config, RunConfig
from imagenet_train.datasets.source import DataSource
from imagenet_train.planning.position import Position
from imagenet_train.planning.schedule import Schedule
from imagenet_train.rundir.checkpoint import RunState, Stateful, resume_path
from imagenet_train.rundir.key_log import consumed_keys
from imagenet_train.rundir.results_mirror import ResultsMirror
from imagenet_train.rundir.run_record import EpochRecords, Launch, derived
from imagenet_train.rundir.trackers import open_tracker


class RunDirectory:
    """RUN_DIR on one rank: `state` writes and restores checkpoints, `records` (rank 0, else None) the epochs'
    lines and the tracker, `mirror` copies the directory to --results."""

    def __init__(
        self,
        run: RunConfig,
        io_timeout: float,
        local_rank: int,
        is_main: bool,
        parts: dict[str, Stateful],
        facts: dict[str, Any],
    ):
        self.path = Path(run.run_dir)
        self.state = RunState(self.path, parts, facts)
        self.mirror = ResultsMirror(self.path, run.results, io_timeout, local_rank)
        self.records = EpochRecords(self.path, run.tensorboard, open_tracker(run)) if is_main else None

    def checkpoint_for(self, resume: str, rank: int, world: int) -> Path | None:
        """The checkpoint --resume names ('latest': the newest every rank holds), or None when there is none."""
        return resume_path(resume, str(self.path), rank, world)

    def consumed_keys(self, position: Position) -> frozenset[str]:
        """The keys of the samples read up to `position` in its epoch, from the key logs (exact modes' resume)."""
        return frozenset(consumed_keys(self.path, position))

    def begin(
        self, cfg: Config, info: Launch, schedule: Schedule, source: DataSource, amp: torch.dtype | None, epoch: int
    ) -> None:
        """Rank 0: config.json with what the run derived from its settings and launch, and the tracker's run."""
        if self.records:
            self.records.begin(cfg.to_json(), derived(info, schedule, source, amp, epoch, cfg.data))
