"""What the input pipeline needs of this installation for a run's settings: the decoder's library and the
--auto-augment policy's builder on the chosen path, each refused in one line. Imports neither torch nor DALI, so
`train --print-config` stays light; the entry points ask it through main/entry_checks.py."""

from __future__ import annotations

from imagenet_train.choices import Decoder
from imagenet_train.config import AugmentConfig, LoaderConfig
from imagenet_train.errors import ImagenetTrainError


def check_pipeline(loader: LoaderConfig, augment: AugmentConfig) -> None:
    """Refuse a decoder whose library is missing, or an --auto-augment word the policy table lacks for its path."""
    if loader.decoder == Decoder.FUSED:
        from imagenet_train.loading.fused_decoder import available

        if not available():
            raise ImagenetTrainError(
                "--decoder fused: needs PyTurboJPEG 1.8 and libturbojpeg (apt-get install libturbojpeg0)"
            )
    if loader.decoder == Decoder.DALI:
        from imagenet_train.loading.dali import available as dali_available

        if not dali_available():
            raise ImagenetTrainError("--decoder dali: needs NVIDIA DALI (pip install 'imagenet-train[dali]')")
    _check_policy(augment, loader.decoder)


def _check_policy(augment: AugmentConfig, decoder: Decoder) -> None:
    """The --auto-augment word has its entry in the one table both paths read, and a DALI builder there under
    --decoder dali; else one line."""
    from imagenet_train.loading.policies import dali_builder, policy_entry

    policy_entry(augment.auto_augment)
    if decoder == Decoder.DALI:
        dali_builder(augment.auto_augment)
