"""How a train transform takes the crop size of the epoch (progressive resizing) inside a persistent worker,
without the worker restarting: every sized transform has `at_size(size)`, a copy cropping to `size`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Then:
    """bytes or image → uint8 CHW tensor: `first` (decode and crop), then `after` (picklable for workers)."""

    first: Callable[..., torch.Tensor]
    after: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, data) -> torch.Tensor:
        return self.after(self.first(data))

    def at_size(self, size: int) -> Then:
        """The same transform cropping to `size`."""
        return dataclasses.replace(self, first=at_size(self.first, size))


def at_size(transform: Callable, size: int) -> Callable:
    """`transform` cropping to `size` (0: as it is). A transform that makes no crop (--decoder dali's bytes,
    cropped later by DALI at the loader's size) is left as it is."""
    resize = getattr(transform, "at_size", None)
    return resize(size) if size and resize is not None else transform
