"""Samples into batches: the (image, label, key) triples a worker decoded, stacked into shared memory, with a
worker's leftover samples never a short batch of their own."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import torch
from torch.utils.data import get_worker_info

Batch = tuple[torch.Tensor, torch.Tensor, list]

log = logging.getLogger(__name__)


def collate(samples: Sequence[tuple]) -> Batch:
    """Stack (image, label, key) samples into (images, labels, keys).

    In a DataLoader worker the batch is stacked straight into shared memory (as torch's default_collate
    does), instead of being copied there again when it is sent to the training process.
    """
    first = samples[0][0]
    out = None
    if get_worker_info() is not None:
        storage = first._typed_storage()._new_shared(first.numel() * len(samples), device=first.device)
        out = first.new(storage).resize_(len(samples), *first.shape)
    images = torch.stack([s[0] for s in samples], out=out)
    labels = torch.tensor([int(s[1]) for s in samples], dtype=torch.int64)
    return images, labels, [s[2] for s in samples]


def batched(
    samples: Iterable, batch_size: int, partial: bool, collate_fn: Callable = collate, at_most: int | None = None
) -> Iterator:
    """Group samples into batches; the samples left after the last full batch are kept only when `partial`.

    Kept, they never form a short batch of their own: a lone sample joins the last full batch (plan.batches_for
    agrees), and two or more are pooled with it and split into two batches of at least half the batch size.
    A last batch of a few samples (a worker's share rarely divides evenly) trained the model on BatchNorm
    statistics of a few images: on small images, where the last stage's maps are 1x1, one such step per epoch
    sent the digits demo in queue mode from top-1 0.98 to 0.91 and through epochs at chance.

    Only the last full batch has to wait for what follows it. `at_most` (never more samples than the stream
    yields without damage, from its index: index_bound; None: unknown) lets a full batch that has at least two
    batches of samples still to come leave at once: holding each batch until the next was full made a cold
    epoch's first batch wait for two batches' decoding. Without damage the batches are the same either way, and
    with up to a batch of corrupt samples after the last early one; should more be corrupt, what is left over is
    a batch of its own, as a stream shorter than a batch is, except a lone sample: a batch of one ends a training
    step in BatchNorm where the last maps are 1x1, so it is dropped, with a warning, as drop_last would drop it.
    """
    pending: list = []
    held: list | None = None  # the last full batch, held back until we know what follows it
    seen, left_early = 0, False
    for sample in samples:
        pending.append(sample)
        seen += 1
        if len(pending) < batch_size:
            continue
        if held is not None:
            yield collate_fn(held)
        held, pending = pending, []
        if not partial or (at_most is not None and at_most - seen >= 2 * batch_size):
            yield collate_fn(held)
            held, left_early = None, True
    if partial and pending and held is not None:
        pooled = held + pending
        held, pending = (pooled, []) if len(pending) == 1 else (pooled[: len(pooled) // 2], pooled[len(pooled) // 2 :])
    if held is not None:
        yield collate_fn(held)
    if pending and partial:
        if len(pending) == 1 and left_early:  # the index counted samples that did not come (corrupt ones)
            log.warning("one sample left over after the index's count fell short (corrupt samples): not a batch of one")
            return
        yield collate_fn(pending)


def index_bound(urls: Sequence[str], sizes: Mapping[str, int], skipped: int) -> int | None:
    """Never more samples than a worker's shards `urls` (samples per URL in `sizes`) yield without damage when
    `skipped` keys are left out; a shard read more than once (--repeat, repeated augmentation) loses each skipped
    key once per read. None where a shard is not counted."""
    if not all(url in sizes for url in urls):
        return None
    return sum(sizes[url] for url in urls) - skipped * max(Counter(urls).values(), default=1)
