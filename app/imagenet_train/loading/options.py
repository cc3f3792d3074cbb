"""What the loader can be asked for: its decoders, its broken-shard policies and the crop it makes by default.

Torch-free, so config.py can declare the settings with these without importing the loader.
"""

from __future__ import annotations

from enum import Enum

CROP_SIZE = 224  # training crop (and evaluation crop unless set apart), in pixels (ResNet-50's ImageNet recipe)
MIN_CROP_SCALE = 0.08  # the smallest area fraction RandomResizedCrop keeps (torchvision's default)
# Corrupt samples in a row that stop a worker (--max-corrupt-streak). Damage is rare and scattered: a tar that
# breaks is a broken shard, not corrupt samples, and a shuffle buffer (or the resampled mode's interleave) spreads
# even a wholly undecodable shard of `shards`' 1,000 samples out. A thousand in a row means nothing decodes: data
# that is not JPEG, or a decoder that cannot work here. At the ~20 us a refused header costs, it is found at once.
MAX_CORRUPT_STREAK = 1000


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

    def __str__(self) -> str:
        return self.value


class Interpolation(str, Enum):
    """How training crops and evaluation resizes are resampled (the value is the --interpolation word)."""

    BILINEAR = "bilinear"  # torchvision's default
    BICUBIC = "bicubic"  # timm's, and the ViT/EfficientNet figures'

    def __str__(self) -> str:
        return self.value
