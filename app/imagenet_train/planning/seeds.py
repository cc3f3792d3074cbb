"""The seed each rank's augmentation draws from: every rank starts from the run's seed (the same initial
weights), then crops with its own."""

from __future__ import annotations


def augmentation_seed(seed: int, rank: int) -> int:
    """The seed of a rank's augmentation: each rank draws its own crops, reproducibly."""
    return seed + 1000 * rank
