"""Per-epoch loader settings handed to persistent DataLoader workers through a small file.

Persistent workers keep the copy of the dataset they were started with; what the training process changes
between epochs (the epoch, a resumed epoch's consumed keys and tag, the epoch length) reaches them here.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import weakref
from dataclasses import dataclass


@dataclass(frozen=True)
class EpochState:
    """What a worker needs to know about the epoch it is about to read."""

    epoch: int
    skip_keys: frozenset
    resume_tag: str
    batches: int | None


class EpochStateFile:
    """A private file the training process rewrites before each epoch and its workers read at its start."""

    def __init__(self) -> None:
        handle, self.path = tempfile.mkstemp(prefix="imagenet-train-epoch-", suffix=".pkl")
        os.close(handle)
        weakref.finalize(self, _remove, self.path)

    def write(self, state: EpochState) -> None:
        """Replace the file atomically, so a worker never reads half of it."""
        partial = f"{self.path}.partial"
        with open(partial, "wb") as stream:
            pickle.dump(state, stream)
        os.replace(partial, self.path)


def read_epoch_state(path: str) -> EpochState:
    """The settings the training process wrote for the coming epoch."""
    with open(path, "rb") as stream:
        return pickle.load(stream)


def _remove(path: str) -> None:
    for name in (path, f"{path}.partial"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
