"""Per-epoch loader settings handed to persistent DataLoader workers through a small JSON file.

Persistent workers keep the copy of the dataset they were started with; what the training process changes
between epochs (the epoch, a resumed epoch's consumed keys and tag, the epoch length, the epoch's crop size)
reaches them here.
The file lives in a folder this process made for itself (mode 0700, under $TMPDIR), is replaced atomically
under a fresh random name, is plain JSON (never a pickle), and goes when the loader closes or the process ends.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import weakref
from dataclasses import dataclass

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.atomic import atomic_write

STATE_NAME = "state.json"


@dataclass(frozen=True)
class EpochState:
    """What a worker needs to know about the epoch it is about to read."""

    epoch: int
    skip_keys: frozenset
    resume_tag: str
    batches: int | None
    crop_size: int = 0  # the epoch's train crop size (progressive resizing); 0: the transform's own

    def to_json(self) -> str:
        """The state as JSON (keys as a sorted list)."""
        return json.dumps(
            {
                "epoch": self.epoch,
                "skip_keys": sorted(self.skip_keys),
                "resume_tag": self.resume_tag,
                "batches": self.batches,
                "crop_size": self.crop_size,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> EpochState:
        """Parse what `to_json` wrote; anything else is a ValueError."""
        data = json.loads(text)
        keys, batches = data["skip_keys"], data["batches"]
        if not (
            isinstance(data["epoch"], int)
            and isinstance(data["resume_tag"], str)
            and isinstance(keys, list)
            and all(isinstance(key, str) for key in keys)
            and (batches is None or isinstance(batches, int))
            and isinstance(data["crop_size"], int)
        ):
            raise ValueError("unexpected field types")
        return cls(data["epoch"], frozenset(keys), data["resume_tag"], batches, data["crop_size"])


class EpochStateFile:
    """A private file the training process rewrites before each epoch and its workers read at its start."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="imagenet-train-epoch-")  # 0700, a fresh name: no one else's
        self.path = os.path.join(self.folder, STATE_NAME)
        # Only the creating process removes it: a forked child that exits normally must not take it away.
        self._finalizer = weakref.finalize(self, _remove, self.folder, os.getpid())

    def write(self, state: EpochState) -> None:
        """Replace the file atomically, so a worker never reads half of it."""
        _check_private(self.folder)
        with atomic_write(self.path, "w") as stream:
            stream.write(state.to_json())

    def close(self) -> None:
        """Remove the folder and the file (also done when the object is collected or the process exits)."""
        self._finalizer()


def read_epoch_state(path: str) -> EpochState:
    """The settings the training process wrote for the coming epoch, from a folder only this user can write."""
    try:
        _check_private(os.path.dirname(path))
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(handle) as stream:
            if os.fstat(stream.fileno()).st_uid != os.geteuid():
                raise ImagenetTrainError(f"{path}: the loader's epoch state is not this user's file")
            return EpochState.from_json(stream.read())
    except OSError as error:
        raise ImagenetTrainError(f"{path}: cannot read the loader's epoch state ({error.strerror})") from None
    except (ValueError, KeyError, TypeError):
        raise ImagenetTrainError(f"{path}: the loader's epoch state is not what this program wrote") from None


def _check_private(folder: str) -> None:
    """The folder is a real directory of this user that no one else may enter; else an error naming it."""
    info = os.lstat(folder)
    # Group and other bits only: under a pod's fsGroup the kubelet makes the volume setgid, and the
    # folder mkdtemp makes in it inherits that bit (02700), which lets no one else in.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise ImagenetTrainError(f"{folder}: expected a private directory of this user (mode 0700), refused")


def _remove(folder: str, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)
