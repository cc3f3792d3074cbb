"""Batches on the training device: copied one step ahead (the next batch's copy overlaps the current step);
the step normalises them as the model takes them (training/batch_input.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from imagenet_train.loading.batching import Batch


def device_batches(batches: Iterable[Batch], device: torch.device) -> Iterator[Batch]:
    """(images, labels, keys) with images and labels on `device`.

    On a GPU the next batch is copied on a side stream once the current step is queued, so the copy runs
    while the GPU computes that step and the training thread never waits for it; the batches should
    come in pinned memory (the loader's pin_memory) for the copy to be asynchronous. Elsewhere batches
    pass through unchanged.
    """
    if device.type != "cuda":
        yield from batches
        return
    side = torch.cuda.Stream(device)
    source = iter(batches)

    def start_copy() -> Batch | None:
        batch = next(source, None)
        if batch is None:
            return None
        images, labels, keys = batch
        with torch.cuda.stream(side):
            return images.to(device, non_blocking=True), labels.to(device, non_blocking=True), keys

    upcoming = start_copy()
    while upcoming is not None:
        current = torch.cuda.current_stream(device)
        current.wait_stream(side)  # the step's kernels wait for the copy on the GPU, not on the host
        images, labels, keys = upcoming
        # The tensors were made on the side stream: keep their memory from reuse until this step is done.
        images.record_stream(current)
        labels.record_stream(current)
        yield images, labels, keys
        # The step was queued: wait for the next batch from the loader and start its copy while it runs.
        upcoming = start_copy()
