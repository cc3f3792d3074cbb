"""The run configuration: one object with a section per concern, saved as `config.json` in every run."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from .errors import ImagenetTrainError

MODES = ("resampled", "split", "queue")
AMP_MODES = ("auto", "bf16", "fp16", "off")
DECODERS = ("simplejpeg", "fused", "pil")


@dataclass
class DataConfig:
    shards: str = ""  # index (shards.json), its directory, or a URL to either
    train_urls: str = ""  # brace spec instead of an index, e.g. http://host/x-train-{000000..000146}.tar
    val_urls: str = ""
    train_samples: int = 0  # with train_urls: samples in the training set (sets the epoch length)
    num_classes: int = 0  # 0: from the index
    mode: str = "resampled"
    batch_size: int = 256  # per rank
    workers: int = 8  # DataLoader workers per rank
    image_size: int = 224
    val_resize: int = 0  # 0: image_size / 0.875
    min_crop_scale: float = 0.08
    hflip: bool = True
    decoder: str = "simplejpeg"  # train decoder; see DECODERS and BENCHMARKS.md for which is faster where
    shuffle_buffer: int = 1000
    epoch_batches: int = 0  # 0: one pass over the data; split mode: cut every rank at this many batches
    repeat: int = 1  # split mode: each worker reads its shards this many times per epoch
    retries: int = 5
    cache_dir: str = ""  # node-local directory for copies of remote shards (second epoch on: local reads)
    loader_timeout: float = 600.0  # seconds without a batch before the run fails instead of hanging


@dataclass
class OptimConfig:
    lr: float = 0.1  # for a global batch of 256; scaled linearly with the global batch
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 1e-4
    label_smoothing: float = 0.1
    warmup_epochs: float = 1.0


@dataclass
class RunConfig:
    arch: str = "resnet50"
    epochs: int = 90
    amp: str = "auto"
    channels_last: bool = True  # applied on GPU only
    seed: int = 0
    run_dir: str = "runs/latest"
    results: str = ""  # gs://BUCKET/PREFIX: mirror the run directory there as training goes
    resume: str = ""  # "", "latest" or a checkpoint path
    eval_every: int = 1
    checkpoint_every: int = 0  # also checkpoint every N batches inside an epoch (0: at epoch ends only)
    log_keys: bool = False  # debug: write every sample key read, per rank and epoch
    total_samples: int = 0  # train by samples seen instead of --epochs (resampled; intervals of --epoch-batches)
    force: bool = False  # run even when the pre-flight plan says the job will hang


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    def validate(self) -> Config:
        """Reject settings that cannot work, naming the option."""
        data = self.data
        if not data.shards and not data.train_urls:
            raise ImagenetTrainError("--shards: give a shard index (or --train-urls)")
        if data.mode not in MODES:
            raise ImagenetTrainError(f"--mode: expected one of {', '.join(MODES)}, got '{data.mode}'")
        if data.decoder not in DECODERS:
            raise ImagenetTrainError(f"--decoder: expected one of {', '.join(DECODERS)}, got '{data.decoder}'")
        if data.decoder == "fused":
            from .jpegcrop import available

            if not available():
                raise ImagenetTrainError(
                    "--decoder fused: needs PyTurboJPEG 1.8 and libturbojpeg (apt-get install libturbojpeg0)"
                )
        if self.run.amp not in AMP_MODES:
            raise ImagenetTrainError(f"--amp: expected one of {', '.join(AMP_MODES)}, got '{self.run.amp}'")
        for name in ("batch_size", "image_size"):
            if getattr(data, name) < 1:
                raise ImagenetTrainError(f"--{name.replace('_', '-')}: must be at least 1")
        if data.workers < 0 or self.run.epochs < 1:
            raise ImagenetTrainError("--workers must be >= 0 and --epochs >= 1")
        if self.run.total_samples and data.mode != "resampled":
            raise ImagenetTrainError("--total-samples: needs --mode resampled (an endless stream of equal batches)")
        if not 0 < data.min_crop_scale <= 1:
            raise ImagenetTrainError("--min-crop-scale: expected a fraction in (0, 1]")
        return self
