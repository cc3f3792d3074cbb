"""The closed sets of the run's settings that belong to no lower layer: each an Enum whose values are the words the
flags take. On the ground floor: it imports nothing of the project, so every package can type against it."""

from __future__ import annotations

from enum import Enum


class Amp(str, Enum):
    """Mixed precision (the value is the --amp word)."""

    AUTO = "auto"  # bf16 on a GPU that has it, else fp16; off on CPU
    BF16 = "bf16"
    FP16 = "fp16"
    OFF = "off"

    def __str__(self) -> str:
        return self.value


class WeightsHead(str, Enum):
    """What --weights does with a classifier head sized for another number of classes (the --weights-head word)."""

    REFUSE = "refuse"  # one error line naming the tensor and both shapes
    REPLACE = "replace"  # load everything else; the head keeps its fresh initialisation

    def __str__(self) -> str:
        return self.value


DEFAULT_DROP_PATH = -1.0  # --drop-path -1: the model's own default


class Stem(str, Enum):
    """A ResNet's first layers (the --stem word)."""

    IMAGENET = "imagenet"  # the architecture's own: torchvision's 7x7 stride-2 conv and max-pool (/4 before block 1)
    SMALL = "small"  # a 3x3 stride-1 conv and no max-pool, as CIFAR ResNets: for inputs of 64 px or less

    def __str__(self) -> str:
        return self.value


class Tracker(str, Enum):
    """Where rank 0 also sends a run's params and metrics (the --tracker word)."""

    NONE = "none"
    MLFLOW = "mlflow"
    WANDB = "wandb"

    def __str__(self) -> str:
        return self.value
