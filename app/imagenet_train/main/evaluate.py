"""`imagenet-train evaluate` on this rank (torchvision's --test-only): a weights file or a checkpoint's (EMA)
weights scored on a run's val shards by every rank of the launch, each sample once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from imagenet_train.choices import Mode
from imagenet_train.datasets.source import run_source
from imagenet_train.errors import ImagenetTrainError, clip
from imagenet_train.loading.batches import RunBatches
from imagenet_train.loading.workers import start_worker_server
from imagenet_train.main.entry_checks import RunnableConfig, refuse_unchecked
from imagenet_train.training.dist import DistInfo, cleanup, init_distributed
from imagenet_train.training.evaluation import evaluate
from imagenet_train.training.models import architecture
from imagenet_train.training.progress import evaluating
from imagenet_train.training.step import amp_dtype
from imagenet_train.weights_files import MissingEntry, load_weights

NO_VAL_SHARDS = "evaluate: no val shards; expected an index with a val split (or --val-urls)"


def evaluate_weights(cfg: RunnableConfig, path: str | Path, use_ema: bool = False) -> tuple[dict, DistInfo]:
    """`imagenet-train evaluate`: a weights file or checkpoint (its EMA with `use_ema`) scored on the val shards
    of `cfg` (the run's Config, checked by `runnable`: a plain Config is refused in one line) by every rank of the
    launch, each sample once; the record (every rank's) and this rank."""
    refuse_unchecked(cfg, "evaluate_weights")
    if cfg.loader.workers:
        start_worker_server()  # its imports overlap the weights' load, the index's fetch and the model's build
    weights = ema_weights(path) if use_ema else load_weights(path)  # a bad file fails before any process group
    source = run_source(cfg.data, cfg.loader.io_timeout)
    if not source.val_urls:
        raise ImagenetTrainError(NO_VAL_SHARDS)
    model = architecture(cfg.run, source.num_classes)
    try:
        model.load_state_dict(weights)
    except RuntimeError as error:
        reason = clip(str(error).strip().splitlines()[-1].strip(), 120)
        raise ImagenetTrainError(
            f"{path}: weights do not fit --arch {cfg.run.arch} with {source.num_classes} classes ({reason})"
        ) from None
    info = init_distributed()
    try:
        channels_last = cfg.run.channels_last and info.device.type == "cuda"
        memory_format = torch.channels_last if channels_last else torch.preserve_format
        # memory_format is missing from torch's stubs for Module.to
        model = model.to(info.device, memory_format=memory_format)  # type: ignore[call-overload]
        model.eval()
        # The val loader only; resampled mode keeps the unused train loader from drawing a shard queue.
        loader = dataclasses.replace(cfg.loader, mode=Mode.RESAMPLED)
        batches = RunBatches(dataclasses.replace(cfg, loader=loader), info.rank, info.world, info.device, source, 1)
        try:
            if batches.val is None:  # not reached: RunBatches builds a val loader for the val shards checked above
                raise ImagenetTrainError(NO_VAL_SHARDS)
            record, _ = evaluate(
                model,
                batches.val,
                evaluating(batches.val_batches(), f"evaluating {Path(path).name}", info.is_main),
                info,
                amp_dtype(cfg.run.amp, info.device),
                channels_last,
                source.num_classes,
                tta=cfg.run.val_tta,
                per_class=True,
            )
        finally:
            batches.close()
        return record, info
    finally:
        cleanup()


def ema_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The EMA's weights in a checkpoint of a --model-ema run, as a model's state dict; else one error line."""
    try:
        state = load_weights(path, entry="ema")
    except MissingEntry:
        raise ImagenetTrainError(
            f"--ema: {path} holds no EMA weights; expected a checkpoint of a run trained with --model-ema"
        ) from None
    return {key.removeprefix("module."): value for key, value in state.items() if key.startswith("module.")}
