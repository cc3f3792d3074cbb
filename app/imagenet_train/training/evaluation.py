"""Validation: loss, top-1 and top-k over every rank's share of the val shards, summed on the device and
reduced once at the end (no host sync per batch)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.loading.normalize import normalize
from imagenet_train.loading.stream import EpochLoader
from imagenet_train.training.dist import DistInfo, all_sum


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loader: EpochLoader,
    batches: Iterable,
    info: DistInfo,
    amp: torch.dtype | None,
    channels_last: bool,
    num_classes: int,
    keep_keys: bool = False,
) -> tuple[dict, list[str]]:
    """The epoch's validation record (identical on every rank) and the keys this rank read (if `keep_keys`).

    `batches` are `loader`'s (images, labels, keys) on the device; `loader` reports the damage it met.
    """
    topk = min(5, num_classes)
    totals = torch.zeros(3, dtype=torch.float64, device=info.device)  # loss, top-1 hits, top-k hits
    count, keys = 0, []
    damage_before = loader.damage()
    for images, labels, batch_keys in batches:
        images = normalize(images, channels_last)
        with torch.autocast(info.device.type, dtype=amp, enabled=amp is not None):
            logits = model(images)
        hits = logits.topk(topk, dim=1).indices.eq(labels.view(-1, 1))
        loss = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        totals += torch.stack([loss.double(), hits[:, 0].sum().double(), hits.any(dim=1).sum().double()])
        count += len(labels)
        if keep_keys:
            keys.extend(batch_keys)
    _, broken, lost = (now - before for now, before in zip(loader.damage(), damage_before, strict=True))
    loss_sum, correct1, correctk = totals.tolist()
    loss_sum, correct1, correctk, count, broken, lost = all_sum(
        [loss_sum, correct1, correctk, count, broken, lost], info
    )
    if count == 0:
        raise ImagenetTrainError("validation: the val shards held no samples")
    damaged = {"val_broken_shards": int(broken), "val_lost_samples": int(lost)} if broken else {}
    record = {
        "val_loss": loss_sum / count,
        "top1": correct1 / count,
        f"top{topk}": correctk / count,
        "val_samples": int(count),
        **damaged,
    }
    return record, keys
