"""Validation: loss, top-1 and top-k (and, when asked, per-class counts) over every rank's share of the val
shards, summed on the device and reduced once at the end (no host sync per batch); with test-time flip, the
logits of each image and its mirror image averaged. Also the run's final weights (raw or EMA, the better top-1:
`write_final`). `imagenet-train evaluate` calls `evaluate` too (main/evaluate.py), as does the Lightning module
(its `Totals`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.distributed as dist

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.training.batch_input import normalize
from imagenet_train.training.dist import DistInfo, all_sum
from imagenet_train.training.hooks import unsaved_on_stop
from imagenet_train.training.parts import Batches, Loader
from imagenet_train.training.progress import DataWait, evaluating
from imagenet_train.training.step import PREFIX, ModelEma, ema_scores


def take_rank0_buffers(model: torch.nn.Module, info: DistInfo) -> None:
    """Give every rank rank 0's buffers: the BN statistics differ after each rank's last batch, and every rank
    must score the weights that rank 0 checkpoints (as DDP's own forward would broadcast them)."""
    if info.enabled:
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)


def logits_of(model: torch.nn.Module, images: torch.Tensor, tta: bool = False) -> torch.Tensor:
    """The model's logits for a normalised batch; with `tta`, the mean of the logits of the batch and of its
    horizontal mirror (FFCV's lr_tta adds the two; the mean keeps the loss on the same scale)."""
    logits = model(images)
    if tta:
        logits = (logits + model(images.flip(3))) / 2
    return logits


class Totals:
    """One pass's validation sums, kept on the device: loss, top-1 and top-k hits (and, with `per_class`, each
    class's samples and top-1 hits); the sample count on the host. The arithmetic of every evaluation."""

    def __init__(self, num_classes: int, device: torch.device, per_class: bool = False):
        self.num_classes, self.topk = num_classes, min(5, num_classes)
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, top-1 hits, top-k hits
        self.classes = torch.zeros(2, num_classes, dtype=torch.float64, device=device) if per_class else None
        self.count = 0

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Add one batch's logits against its labels."""
        hits = logits.topk(self.topk, dim=1).indices.eq(labels.view(-1, 1))
        loss = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        self.sums += torch.stack([loss.double(), hits[:, 0].sum().double(), hits.any(dim=1).sum().double()])
        if self.classes is not None:
            classes = self.classes
            classes.index_put_((torch.zeros_like(labels), labels), torch.ones_like(labels, dtype=classes.dtype), True)
            classes.index_put_((torch.ones_like(labels), labels), hits[:, 0].to(classes.dtype), True)
        self.count += len(labels)

    def scores(self, loss_sum: float, correct1: float, correctk: float, count: float) -> dict:
        """The record's scores from sums over every rank (`count` samples, not 0)."""
        return {"val_loss": loss_sum / count, "top1": correct1 / count, f"top{self.topk}": correctk / count}


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loader: Loader,
    batches: Iterable,
    info: DistInfo,
    amp: torch.dtype | None,
    channels_last: bool,
    num_classes: int,
    keep_keys: bool = False,
    tta: bool = False,
    per_class: bool = False,
) -> tuple[dict, list[str]]:
    """The epoch's validation record (identical on every rank) and the keys this rank read (if `keep_keys`).

    `batches` are `loader`'s (images, labels, keys) on the device; `loader` reports the damage it met.
    `per_class` adds "class_samples" and "class_top1" (hits), one count per class, summed over the ranks.
    """
    totals, keys = Totals(num_classes, info.device, per_class), []
    damage_before = loader.damage()
    for images, labels, batch_keys in batches:
        images = normalize(images, channels_last)
        with torch.autocast(info.device.type, dtype=amp, enabled=amp is not None):
            totals.add(logits_of(model, images, tta), labels)
        if keep_keys:
            keys.extend(batch_keys)
    _, broken_here, lost_here = (now - before for now, before in zip(loader.damage(), damage_before, strict=True))
    loss_sum, correct1, correctk, count, broken, lost = all_sum(
        [*totals.sums.tolist(), totals.count, broken_here, lost_here], info
    )
    if count == 0:
        raise ImagenetTrainError("validation: the val shards held no samples")
    extra: dict[str, int | list[int]] = (
        {"val_broken_shards": int(broken), "val_lost_samples": int(lost)} if broken else {}
    )
    if per_class and totals.classes is not None:
        counts = [int(n) for n in all_sum(totals.classes.flatten().tolist(), info)]
        extra.update(class_samples=counts[:num_classes], class_top1=counts[num_classes:])
    return {**totals.scores(loss_sum, correct1, correctk, count), "val_samples": int(count), **extra}, keys


@torch.no_grad()
def evaluate_run(
    model: torch.nn.Module,
    ema: ModelEma | None,
    batches: Batches,
    info: DistInfo,
    amp: torch.dtype | None,
    channels_last: bool,
    num_classes: int,
    tta: bool,
    epoch: int,
    write_keys: Callable[[list[str]], None] | None = None,
) -> dict:
    """The training run's evaluation after `epoch`: the model (and its EMA) on every rank's share of the val
    shards; `write_keys` (--log-keys) gets the val keys this rank read. {} without val shards."""
    val = batches.val
    if val is None:
        return {}

    def scored(model: torch.nn.Module, keep_keys: bool = False) -> tuple[dict, list[str]]:
        take_rank0_buffers(model, info)
        waited = DataWait().timed(
            evaluating(batches.val_batches(), "evaluating", info.is_main), "waiting for a val batch"
        )
        return evaluate(model, val, waited, info, amp, channels_last, num_classes, keep_keys, tta)

    model.eval()
    with unsaved_on_stop(f"epoch {epoch}'s checkpoint is written only after its evaluation"):  # a val outage
        record, keys = scored(model, keep_keys=write_keys is not None)
    if write_keys is not None:
        write_keys(keys)
    if ema:
        record.update(ema_scores(scored(ema.module)[0]))
    return record


def final_choice(record: dict, ema: ModelEma | None) -> str:
    """'ema' when the EMA's last top-1 beats the model's, else 'raw'."""
    if ema is not None and record.get(PREFIX + "top1", -1.0) > record.get("top1", -1.0):
        return "ema"
    return "raw"


def write_final(
    save: Callable[[dict[str, torch.Tensor]], Path], model: torch.nn.Module, ema: ModelEma | None, record: dict
) -> str:
    """Write the final weights with `save` (RunDirectory.write_final: RUN_DIR/final.pt) from the raw or the EMA
    weights, the better last top-1; returns which."""
    choice = final_choice(record, ema)
    chosen = ema.module if choice == "ema" and ema is not None else model
    path = save(chosen.state_dict())
    if ema is not None and "top1" in record:
        scores = f"top-1 {record[PREFIX + 'top1']:.4f} EMA, {record['top1']:.4f} raw"
    else:
        scores = "no EMA" if ema is None else "no evaluation to compare"
    print(f"final weights: {'EMA' if choice == 'ema' else 'raw'} ({scores}) in {path}", flush=True)
    return choice
