"""A batch as the model takes it: uint8 NCHW on its device to float, ImageNet-normalised after the copy (a
quarter of the bytes cross the bus), in the memory format the model runs in. The step, evaluation and the Lightning
module take their batches through here."""

from __future__ import annotations

import torch

from imagenet_train.imagenet_stats import IMAGENET_MEAN, IMAGENET_STD

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
