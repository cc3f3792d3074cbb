"""The run configuration: one declaration per setting (type, default, help, range), saved as `config.json`
in every run. The `train` command's flags, their checks and their help all come from here."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from imagenet_train.datasets.pixels import MAX_IMAGE_PIXELS
from imagenet_train.errors import ImagenetTrainError, clip
from imagenet_train.io.resumable import IO_TIMEOUT
from imagenet_train.loading.options import CROP_SIZE, MIN_CROP_SCALE, BrokenShardPolicy, Decoder
from imagenet_train.planning import plan
from imagenet_train.planning.plan import Mode
from imagenet_train.settings import Setting, check, declared, flag, problem, setting


class Amp(str, Enum):
    """Mixed precision (the value is the --amp word)."""

    AUTO = "auto"  # bf16 on a GPU that has it, else fp16; off on CPU
    BF16 = "bf16"
    FP16 = "fp16"
    OFF = "off"

    def __str__(self) -> str:
        return self.value


@dataclass
class DataConfig:
    shards: str = setting("", "shard index (shards.json), its directory, or a URL to either")
    trust_index: bool = setting(
        False,
        "let the index name shards anywhere: absolute URLs, other hosts, local paths, file: and pipe: commands "
        "(off: only names inside the index's own folder; turn on only for an index you wrote yourself)",
    )
    train_urls: str = setting(
        "", "training shards as a URL spec instead of an index, e.g. 'http://host/x-{000000..000146}.tar'"
    )
    val_urls: str = setting("", "validation shards as a URL spec (with --train-urls)")
    train_samples: int = setting(0, "samples in --train-urls (sets the epoch length)", minimum=0)
    num_classes: int = setting(0, "classes (0: from the index)", minimum=0)
    mode: str = setting(
        Mode.RESAMPLED.value,
        "resampled: shards drawn at random, equal batches per rank; split: every sample once, under Join; "
        "queue: every sample once, shards handed out at run time to whichever rank is free",
        choices=Mode,
    )
    batch_size: int = setting(plan.BATCH_SIZE, "batch size per rank", minimum=1, maximum=1 << 20)
    global_batch_size: int = setting(
        0,
        "batch size over all ranks; when set, each rank's batch is this divided by the world size, which must "
        "divide it (0: use --batch-size)",
        minimum=0,
        maximum=1 << 24,
    )
    workers: int = setting(plan.WORKERS, "DataLoader workers per rank", minimum=0, maximum=512)
    image_size: int = setting(CROP_SIZE, "training and evaluation crop size", minimum=1, maximum=8192)
    val_resize: int = setting(
        0, "evaluation resize of the short side before the centre crop (0: size/0.875)", minimum=0, maximum=16384
    )
    min_crop_scale: float = setting(
        MIN_CROP_SCALE, "smallest image area fraction RandomResizedCrop keeps", above=0, maximum=1
    )
    hflip: bool = setting(True, "random horizontal flips")
    decoder: str = setting(
        Decoder.SIMPLEJPEG.value,
        "train-time JPEG decoder: simplejpeg (decode, then crop the uint8 image), fused (crop and DCT-scale "
        "inside libjpeg-turbo via PyTurboJPEG; needs libturbojpeg), pil, or dali (NVIDIA DALI decodes on the GPU "
        "with nvJPEG, fused with crop, flip and normalisation; its CPU backend without a GPU; "
        "pip install 'imagenet-train[dali]')",
        choices=Decoder,
    )
    shuffle_buffer: int = setting(1000, "samples in each shuffle buffer", minimum=0, maximum=1 << 24)
    epoch_batches: int = setting(
        plan.EPOCH_BATCHES,
        "batches per rank per epoch (0: one pass over the data; split mode: cut every rank here)",
        minimum=0,
    )
    repeat: int = setting(
        plan.REPEAT,
        "split mode: each worker reads its shards this many times per epoch (with --epoch-batches)",
        minimum=1,
    )
    io_timeout: float = setting(
        IO_TIMEOUT,
        "seconds to wait out an outage of the shard server or bucket (capped exponential backoff with jitter) "
        "before failing; long enough for a server pod to be rescheduled",
        minimum=0,
        maximum=7 * 24 * 3600,
    )
    on_broken_shard: str = setting(
        BrokenShardPolicy.SKIP.value,
        "a truncated or corrupt shard: skip (keep the samples before the damage, count the rest as lost, warn) or fail",
        choices=BrokenShardPolicy,
    )
    cache_dir: str = setting(
        "",
        "node-local directory to keep copies of remote shards in, so later epochs read local disk; with "
        "--verify-shards each shard is checked there before any of it is used",
    )
    verify_shards: bool = setting(
        True,
        "check every shard against the sha256 and size in the index while reading it (about 3 percent of the "
        "decode's CPU time); a mismatch is a broken shard, found at the shard's end (before use with "
        "--cache-dir); protects only as far as the index itself is trusted",
    )
    max_image_pixels: int = setting(
        MAX_IMAGE_PIXELS,
        "refuse images whose header claims more pixels than this before decoding them (a corrupt sample); "
        "bounds each worker's memory per image at pixels x 3 bytes (0: no cap)",
        minimum=0,
        maximum=1 << 32,
    )
    loader_timeout: float = setting(
        1200.0,
        "seconds without a batch from the DataLoader workers before failing (0: wait forever); "
        "must exceed --io-timeout",
        minimum=0,
        maximum=7 * 24 * 3600,
    )


@dataclass
class OptimConfig:
    lr: float = setting(0.1, "learning rate for a global batch of 256 (scaled linearly)", above=0, maximum=1e3)
    momentum: float = setting(0.9, "SGD momentum", minimum=0, maximum=1)
    nesterov: bool = setting(False, "Nesterov momentum")
    weight_decay: float = setting(1e-4, "weight decay (not applied to biases and norms)", minimum=0, maximum=1)
    label_smoothing: float = setting(0.1, "label smoothing", minimum=0, maximum=1)
    warmup_epochs: float = setting(1.0, "linear warmup before the cosine decay", minimum=0, maximum=1e6)
    clip_grad_norm: float = setting(
        0.0,
        "clip the gradients' global L2 norm to this before each step (0: off); steadies large-batch and fp16 runs",
        minimum=0,
        maximum=1e6,
    )
    mixup_alpha: float = setting(
        0.0,
        "MixUp on each training batch with this Beta alpha (0: off; torchvision's recipe 0.2); the targets become "
        "soft, so the train loss is the cross-entropy against the mixed targets, higher than an unmixed run's",
        minimum=0,
        maximum=100,
    )
    cutmix_alpha: float = setting(
        0.0,
        "CutMix on each training batch with this Beta alpha (0: off; torchvision's recipe 1.0); with --mixup-alpha "
        "too, each batch gets one of the two at random; soft targets as with --mixup-alpha",
        minimum=0,
        maximum=100,
    )
    model_ema: bool = setting(
        False,
        "keep an exponential moving average of the weights (BN buffers included), evaluated beside the model and "
        "saved in every checkpoint; the final weights come from whichever has the better top-1",
    )
    model_ema_steps: int = setting(32, "update the EMA every N optimizer steps", minimum=1, maximum=1 << 20)
    model_ema_decay: float = setting(
        0.99998,
        "EMA decay per sample-epoch as torchvision gives it: the decay per update is adjusted for the global "
        "batch, --model-ema-steps and the epochs; during LR warmup the EMA copies the weights",
        minimum=0,
        maximum=1,
    )


@dataclass
class RunConfig:
    arch: str = setting("resnet50", "torchvision model name")
    epochs: int = setting(90, "epochs to train", minimum=1, maximum=1_000_000)
    amp: str = setting(Amp.AUTO.value, "mixed precision: auto (bf16 on GPU, off on CPU), bf16, fp16, off", choices=Amp)
    channels_last: bool = setting(True, "channels-last memory format on GPU")
    compile: bool = setting(
        False,
        "torch.compile the model (first steps compile; not applied in split/queue mode across ranks, where "
        "Join shadows DDP's collectives)",
    )
    seed: int = setting(plan.SEED, "seed for weights, shard order and augmentation", minimum=0, maximum=2**63 - 1)
    run_dir: str = setting("runs/latest", "directory for config.json, metrics.jsonl and checkpoints")
    results: str = setting("", "gs://BUCKET/PREFIX to mirror the run directory to as training goes (and resume from)")
    resume: str = setting("", "'latest' (newest checkpoint in --run-dir) or a checkpoint path")
    eval_every: int = setting(1, "evaluate every N epochs (and after the last)", minimum=1)
    val_tta: bool = setting(
        False,
        "test-time flip: evaluate on each image and its horizontal mirror and average the two logits (FFCV's lr_tta)",
    )
    checkpoint_every: int = setting(
        0, "also checkpoint every N batches inside an epoch, for mid-epoch resume (0: epoch ends only)", minimum=0
    )
    log_keys: bool = setting(False, "debug: record every sample key read, per rank and epoch, under RUN_DIR/keys")
    total_samples: int = setting(
        0,
        "train for this many samples instead of --epochs (resampled mode; evaluation, checkpoints and metrics "
        "every --epoch-batches batches)",
        minimum=0,
    )
    force: bool = setting(False, "run even when the pre-flight check says the configuration will hang")
    tensorboard: bool = setting(
        True,
        "write TensorBoard events (loss, LR, top-1/top-5, img/s, data wait, per-rank batches) under "
        "RUN_DIR/tensorboard",
    )


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def sections(self) -> tuple[DataConfig, OptimConfig, RunConfig]:
        return self.data, self.optim, self.run

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    def for_world(self, world_size: int) -> Config:
        """This config with each rank's batch derived from --global-batch-size (when set) for `world_size` ranks."""
        total = self.data.global_batch_size
        if not total:
            return self
        if total % world_size:
            raise ImagenetTrainError(
                f"--global-batch-size: {total} does not divide over {world_size} ranks; "
                f"expected a multiple of {world_size}"
            )
        return dataclasses.replace(self, data=dataclasses.replace(self.data, batch_size=total // world_size))

    def validate(self) -> Config:
        """Reject settings that cannot work, naming the option."""
        for section in self.sections():
            for declaration, rule in declared(section):
                check(declaration.name, type(declaration.default), rule, getattr(section, declaration.name))
        data = self.data
        if not data.shards and not data.train_urls:
            raise ImagenetTrainError("--shards: give a shard index (or --train-urls)")
        if data.decoder == Decoder.FUSED:
            from imagenet_train.loading.jpegcrop import available

            if not available():
                raise ImagenetTrainError(
                    "--decoder fused: needs PyTurboJPEG 1.8 and libturbojpeg (apt-get install libturbojpeg0)"
                )
        if data.decoder == Decoder.DALI:
            from imagenet_train.loading.dali import available as dali_available

            if not dali_available():
                raise ImagenetTrainError("--decoder dali: needs NVIDIA DALI (pip install 'imagenet-train[dali]')")
        if self.run.total_samples and data.mode != Mode.RESAMPLED:
            raise ImagenetTrainError("--total-samples: needs --mode resampled (an endless stream of equal batches)")
        if data.loader_timeout and data.loader_timeout <= data.io_timeout:
            raise ImagenetTrainError(
                f"--loader-timeout: {data.loader_timeout:g} s would give up before --io-timeout {data.io_timeout:g} s "
                "has waited out an outage; expected 0 (wait forever) or more than --io-timeout"
            )
        return self


SECTIONS = (DataConfig, OptimConfig, RunConfig)


def defaults() -> dict[str, Any]:
    """Every setting's default, by name."""
    return {d.name: d.default for section in SECTIONS for d, _ in declared(section)}


def settings_from(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A config file's settings, checked: flat names (`batch_size: 64`), or a run's config.json sections."""
    if set(values) <= {"data", "optim", "run", "derived"} and all(isinstance(v, dict) for v in values.values()):
        values = {k: v for name in ("data", "optim", "run") for k, v in values.get(name, {}).items()}
    kinds = {d.name: (type(d.default), rule) for section in SECTIONS for d, rule in declared(section)}
    checked = {}
    for name, value in values.items():
        if name not in kinds:
            raise ImagenetTrainError(
                f"{source}: unknown setting '{clip(name)}'; expected a `train` option name with underscores, "
                "e.g. batch_size for --batch-size"
            )
        kind, rule = kinds[name]
        wanted = problem(kind, rule, value)
        if wanted:
            raise ImagenetTrainError(f"{source}: {name} ({flag(name)}): expected {wanted}, got '{clip(value)}'")
        checked[name] = kind(value)
    return checked


def declaration(name: str) -> tuple[dataclasses.Field, Setting]:
    """A declared setting by name, for the commands besides `train` that take its flag (plan)."""
    return next((d, rule) for section in SECTIONS for d, rule in declared(section) if d.name == name)


def setting_help(name: str) -> str:
    """The help of a declared setting, for the commands besides `train` that take its flag (probe, summarize)."""
    return declaration(name)[1].help


MAX_SETTINGS_BYTES = 1 << 20  # config, values and deployment files are a few KB


def read_mapping(path: str | Path, label: str) -> dict[str, Any]:
    """A YAML (or JSON) file holding a mapping; an empty file is {}. Errors name `label` (the flag) and the file.

    YAML aliases are refused: a few hundred bytes of nested aliases expand to gigabytes ("billion laughs").
    """
    import yaml

    loader, alias_error = _no_alias_loader()
    try:
        with open(path, "rb") as stream:
            raw = stream.read(MAX_SETTINGS_BYTES + 1)
    except OSError as error:
        raise ImagenetTrainError(f"{label} {path}: cannot read ({error.strerror})") from None
    if len(raw) > MAX_SETTINGS_BYTES:
        raise ImagenetTrainError(f"{label} {path}: more than {MAX_SETTINGS_BYTES} bytes; expected a settings file")
    try:
        values = yaml.load(raw.decode("utf-8"), Loader=loader)  # a SafeLoader that also refuses aliases
    except (yaml.YAMLError, ValueError, RecursionError) as error:  # ValueError: bad UTF-8, a 5000-digit int
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        if isinstance(error, alias_error):
            raise ImagenetTrainError(
                f"{label} {path}: a YAML alias (*name){where}; expected the values written out"
            ) from None
        raise ImagenetTrainError(f"{label} {path}: not valid YAML or JSON{where}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ImagenetTrainError(f"{label} {path}: expected a mapping, got {type(values).__name__}")
    return values


@functools.cache
def _no_alias_loader() -> tuple[type, type]:
    import yaml

    class AliasError(yaml.YAMLError):
        """A YAML alias, refused."""

    class NoAliasLoader(yaml.SafeLoader):
        """yaml.SafeLoader that stops at the first alias instead of sharing (and later expanding) a node."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                error = AliasError("alias")
                error.problem_mark = self.peek_event().start_mark
                raise error
            return super().compose_node(parent, index)

    return NoAliasLoader, AliasError


def load_settings(path: str | Path) -> dict[str, Any]:
    """The settings in a YAML or JSON config file (`train --config FILE`), checked."""
    return settings_from(read_mapping(path, "--config"), f"--config {path}")
