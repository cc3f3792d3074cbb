"""Training on this rank as the launcher started it: the process group, the trainer and what it is handed (its
batches and its run directory: `run_parts`), and the order they are torn down in."""

from __future__ import annotations

import gc
import logging
import os
import signal
from pathlib import Path
from typing import Any

from imagenet_train import waiting
from imagenet_train.config import Config, RunConfig
from imagenet_train.datasets.source import DataSource, run_source
from imagenet_train.errors import ImagenetTrainError, PeerLost, Preempted
from imagenet_train.loading.batches import RunBatches
from imagenet_train.loading.workers import start_worker_server
from imagenet_train.main.entry_checks import RunnableConfig, refuse_unchecked
from imagenet_train.planning.plan import preflight_check
from imagenet_train.rundir.checkpoint import Stateful, latest
from imagenet_train.rundir.directory import RunDirectory
from imagenet_train.training.dist import (
    DistInfo,
    cleanup,
    init_distributed,
    is_collective_timeout,
    is_peer_lost,
    peer_lost_reason,
)
from imagenet_train.training.hooks import StopRequest
from imagenet_train.training.liveness import Heartbeat
from imagenet_train.training.loop import Trainer
from imagenet_train.training.parts import RunParts

log = logging.getLogger(__name__)


def train(cfg: RunnableConfig) -> dict:
    """Run training on this rank as torchrun launched it; returns the last epoch's metrics.

    `cfg` is checked already (main/entry_checks.py's `runnable`, as every entry point does at its boundary); a plain
    Config is refused in one line. Raises Preempted after a clean stop on SIGTERM/SIGUSR1 (the CLI exits with 128 +
    the signal).
    """
    refuse_unchecked(cfg, "train")
    request = StopRequest()
    request.install()  # before the first collective: a signal during start-up is noted, not fatal
    if cfg.loader.workers:
        # Its imports (torch, torchvision: seconds) overlap the rendezvous, the index's fetch, the preflight and the
        # model's build. A fork and exec of a fresh interpreter, so it may start after threads do.
        start_worker_server()
    info = init_distributed(cfg.run.collective_timeout, cfg.run.run_dir)
    beat = Heartbeat(info.rank, info.world, cfg.run.collective_timeout).start() if info.enabled else None
    try:
        cfg = cfg.for_world(info.world)  # each rank's batch from --global-batch-size, for preflight and the run
        if cfg.run.preflight:
            from imagenet_train.ops.preflight import run_preflight

            with waiting.blocking("the preflight checks (an all-reduce over every rank)"):
                run_preflight(cfg, info)
        result = _run_released(cfg, info, request, beat)
        if info.is_main:
            print(f"run directory: {Path(cfg.run.run_dir).resolve()}", flush=True)
        return result
    finally:
        if beat is not None:
            beat.stop()
        cleanup()


def _run_released(cfg: Config, info: DistInfo, request: StopRequest, beat: Heartbeat | None = None) -> dict:
    """The run, with the trainer (its DDP model and loader processes) released before the caller tears down
    the process group, also when the run ends in an error or a pre-emption: torn down the other way round,
    a rank can block in its exit past the grace period."""
    trainer: Trainer | None = None
    failure: BaseException | None = None
    parts = run_parts(cfg, info)
    try:
        with waiting.interruptible("fetching the shard index"):
            source = run_source(cfg.data, cfg.loader.io_timeout)
        preflight_check(cfg, source.train_sizes, info.world, info.is_main)  # before the model: a plan that hangs
        if (
            info.is_main
            and info.device.type == "cpu"
            and (advice := cpu_advice(cfg.loader.batch_size, cfg.loader.workers))
        ):
            log.warning("pre-flight: %s", advice)
        with waiting.blocking("starting (the first collectives: DDP's broadcast, the queue's name)"):
            # DDP's constructor broadcasts: a peer can be lost here
            trainer = Trainer(cfg, info, source, parts, request)
        return trainer.run()
    except waiting.Stopping as stop:
        if trainer is not None:
            trainer.batches.abandon()  # again, for a stop outside the loop's wait (evaluation, the mirror's flush)
        reason = stop.reason or ("before the first step" if trainer is None else "no step since the last checkpoint")
        failure = _left_unsaved(info, stop.signum, stop.where or "waiting", reason, cfg.run)
    except (Preempted, ImagenetTrainError) as error:
        failure = error.with_traceback(None)  # the traceback holds the loop's frames and, in them, the loaders
        failure.__context__ = failure.__cause__ = None
    except Exception as error:
        if not is_peer_lost(error):
            raise
        log.debug("a collective failed", exc_info=error)
        failure = _peer_lost(error, info, cfg.run, beat)
        if trainer is not None and waiting.requested() and waiting.cut_short(now=True):
            trainer.batches.abandon()  # its workers may be asleep in an outage
    finally:
        del trainer
        if not waiting.cut_short():  # leaving at once (waiting.leave_now): collecting the loaders takes seconds
            gc.collect()
    raise failure


CPU_BATCH = 32  # per rank: what a CPU steps through in seconds, not minutes (a ResNet-50 step at 256 needs ~20 GB)


def cpu_advice(batch_size: int, workers: int, cpus: int | None = None) -> str | None:
    """One line for a CPU-only run whose batch or workers are the defaults' size, which is sized for a GPU rank
    (None when they are already small)."""
    cpus = cpus or os.cpu_count() or 1
    lower = max(1, min(workers, cpus - 1))
    if batch_size <= CPU_BATCH and workers <= lower:
        return None
    return (
        f"training on CPU with --batch-size {batch_size} and --workers {workers} (each holding 4 batches): the "
        f"defaults are sized for one GPU of an 8-GPU node and take many GB here before the first step; on this "
        f"CPU try --batch-size {min(batch_size, CPU_BATCH)} --workers {lower}"
    )


def _peer_lost(error: BaseException, info: DistInfo, run: RunConfig, beat: Heartbeat | None) -> BaseException:
    """The one-line failure of a collective that lost a peer: a stop signal's, a timeout's naming the rank that
    stopped answering, or a peer's that is gone."""
    if waiting.requested():  # signalled, and a peer that was signalled too left while this rank was in a step
        reason = f"another rank left first: {peer_lost_reason(error)}"
        return _left_unsaved(info, waiting.requested(), "in a collective", reason, run)
    if beat is not None and is_collective_timeout(error):
        return PeerLost(beat.who_stopped(PeerLost.exit_code, run.collective_timeout))
    return PeerLost(
        f"rank {info.rank}: another rank is gone ({peer_lost_reason(error)}); exit {PeerLost.exit_code} asks "
        f"the launcher to restart every node, which resumes from the last checkpoint with --resume latest"
    )


def run_parts(cfg: Config, info: DistInfo) -> RunParts:
    """The trainer's batches and run directory on this rank, each made by a named function when the trainer asks
    (after its model), so that a reader follows the config into them."""

    def batches(source: DataSource, steps: int, epoch_length: float) -> RunBatches:
        """The run's loaders: the first epoch `steps` batches long, the ramp's data epoch `epoch_length` epochs."""
        return RunBatches(cfg, info.rank, info.world, info.device, source, steps, epoch_length)

    def directory(saved: dict[str, Stateful], facts: dict[str, Any]) -> RunDirectory:
        """RUN_DIR on this rank, its checkpoints holding `saved` and recording `facts`."""
        return RunDirectory(cfg.run, cfg.loader.io_timeout, info.local_rank, info.is_main, saved, facts)

    return RunParts(batches, directory)


def _left_unsaved(info: DistInfo, signum: int, where: str, reason: str, run: RunConfig) -> Preempted:
    """Say in one line that this rank leaves on a stop signal without a checkpoint, why, and how to go on."""
    name = signal.Signals(signum).name
    try:
        resumable = bool(run.results) or latest(run.run_dir) is not None  # --results: the bucket may hold one
    except OSError:
        resumable = True
    if resumable:
        hint = "continue with --resume latest"
    else:  # nothing to resume: --resume latest would only start afresh
        reason = "no step taken yet" if reason == "no step since the last checkpoint" else reason
        hint = "continue by running the same command again: there is no checkpoint to resume from"
    print(
        f"rank {info.rank}: stopped by {name} while {where}: exiting without a checkpoint ({reason}); {hint}",
        flush=True,
    )
    return Preempted(signum)
