"""The closed sets of the run's settings, each a str Enum whose values are the words the flags take, and the
defaults the planner shares with config.py. On the ground floor: it imports only the standard library, so every
package (planning/ included) can type against it."""

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


class CompileMode(str, Enum):
    """torch.compile's mode under --compile (the value is the --compile-mode word and torch's own name)."""

    DEFAULT = "default"  # fused kernels (BatchNorm, ReLU and the adds around them), the launches as in eager
    REDUCE_OVERHEAD = "reduce-overhead"  # the same kernels replayed as a CUDA graph: one launch per step
    MAX_AUTOTUNE = "max-autotune"  # kernel configurations searched at compile time (minutes), and CUDA graphs
    MAX_AUTOTUNE_NO_CUDAGRAPHS = "max-autotune-no-cudagraphs"

    @property
    def cuda_graphs(self) -> bool:
        """Whether torch replays the compiled step as a CUDA graph in this mode."""
        return self in (CompileMode.REDUCE_OVERHEAD, CompileMode.MAX_AUTOTUNE)

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


# The defaults of the training settings the planner shares (config.py declares those settings with these), so
# that a Setup made by hand plans what `train` would run.
WORKERS = 8  # DataLoader workers per rank
BATCH_SIZE = 256  # per rank
EPOCH_BATCHES = 0  # resampled: one pass over the data; split: no cut
REPEAT = 1  # split: each worker reads its shard list once per epoch
SEED = 0
AUTO_WARMUP = -1.0  # --warmup-epochs -1: grows with the global batch


class Mode(str, Enum):
    """How shards reach the ranks (the value is the --mode word)."""

    RESAMPLED = "resampled"  # shards drawn at random: equal batches per rank by construction
    SPLIT = "split"  # every sample once, shards split over ranks and workers; the step runs under Join
    QUEUE = "queue"  # every sample once, shards handed out at run time to whichever rank is free

    def __str__(self) -> str:
        return self.value  # in messages, the --mode word (Python 3.11+ would format it as Mode.SPLIT)


class Opt(str, Enum):
    """The optimizer (the value is the --opt word)."""

    SGD = "sgd"  # torch.optim.SGD; --nesterov for Nesterov momentum
    ADAMW = "adamw"  # torch.optim.AdamW
    LAMB = "lamb"  # timm.optim.Lamb
    LARS = "lars"  # timm.optim.Lars; --nesterov applies

    def __str__(self) -> str:
        return self.value


MOMENTUM_OPTS = (Opt.SGD, Opt.LARS)  # the ones --momentum and --nesterov apply to
TIMM_OPTS = (Opt.LAMB, Opt.LARS)  # the ones that need the [timm] extra
FUSED_OPTS = (Opt.SGD, Opt.ADAMW)  # the ones torch can run as one fused kernel (--fused-optimizer)


class LrSchedule(str, Enum):
    """The LR's shape after the warmup (the value is the --lr-schedule word)."""

    COSINE = "cosine"  # half a cosine from the peak to --lr-end
    STEP = "step"  # torchvision's: x --lr-gamma every --lr-step-epochs epochs
    POLY = "poly"  # MLPerf's: polynomial decay, power 2, from the peak to --lr-end
    TRIANGULAR = "triangular"  # FFCV's: straight down from the peak to 0 at the end

    def __str__(self) -> str:
        return self.value


class Loss(str, Enum):
    """The training loss (the value is the --loss word)."""

    CE = "ce"  # torch's CrossEntropyLoss with --label-smoothing
    BCE = "bce"  # timm.loss.BinaryCrossEntropy (ResNet Strikes Back)

    def __str__(self) -> str:
        return self.value


class WarmupMethod(str, Enum):
    """The LR's shape during the warmup (the value is the --lr-warmup-method word; torchvision's names)."""

    LINEAR = "linear"  # torchvision's LinearLR: from --lr-warmup-decay x the peak up to the peak
    CONSTANT = "constant"  # torchvision's ConstantLR: --lr-warmup-decay x the peak throughout, then the peak

    def __str__(self) -> str:
        return self.value


class Decoder(str, Enum):
    """How a training JPEG becomes a crop (the value is the --decoder word)."""

    SIMPLEJPEG = "simplejpeg"  # decode the whole image, then crop the uint8 tensor
    FUSED = "fused"  # crop and DCT-scale inside libjpeg-turbo
    PIL = "pil"
    DALI = "dali"  # workers hand over the JPEG bytes; DALI decodes them in the rank

    def __str__(self) -> str:
        return self.value  # in messages and help, the --decoder word


class BrokenShardPolicy(str, Enum):
    """What a truncated or corrupt shard does to the stream (the value is the --on-broken-shard word)."""

    SKIP = "skip"  # keep the samples before the damage, count the rest as lost, go on
    FAIL = "fail"

    def __str__(self) -> str:
        return self.value


class AutoAugment(str, Enum):
    """The augmentation policy after the crop and flip (the value is the --auto-augment word)."""

    NONE = "none"
    TA_WIDE = "ta_wide"  # TrivialAugmentWide
    RA = "ra"  # RandAugment
    IMAGENET = "imagenet"  # AutoAugment, ImageNet policy
    AUGMIX = "augmix"  # AugMix (torchvision's reference word; not on DALI)

    def __str__(self) -> str:
        return self.value


class Interpolation(str, Enum):
    """How training crops and evaluation resizes are resampled (the value is the --interpolation word)."""

    BILINEAR = "bilinear"  # torchvision's default
    BICUBIC = "bicubic"  # timm's, and the ViT/EfficientNet figures'

    def __str__(self) -> str:
        return self.value
