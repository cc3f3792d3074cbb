"""Batches on the training device: copied one step ahead (the next batch's copy overlaps the current step), and
as the model takes them: uint8 NCHW on its device to float, ImageNet-normalised (no decoder here)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from imagenet_train.loading.batching import Batch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_CONSTANTS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def normalize_constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """ImageNet mean and std (x255) as (1, 3, 1, 1) float tensors on `device`, built once per device.

    Building them per call would be two blocking host-to-device copies per step on a GPU.
    """
    if device not in _CONSTANTS:
        mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255
        _CONSTANTS[device] = (mean, std)
    return _CONSTANTS[device]


def normalize(images: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    """uint8 NCHW batch (on its device) to float, ImageNet-normalised; done after the copy to save bandwidth.

    A float batch is taken as already normalised (the DALI decoder does it on the GPU).
    """
    if images.dtype == torch.uint8:
        mean, std = normalize_constants(images.device)
        images = images.float().sub_(mean).div_(std)
    return images.contiguous(memory_format=torch.channels_last) if channels_last else images


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
