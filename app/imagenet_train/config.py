"""The run configuration: one declaration per setting (type, default, help, range), saved as `config.json`
in every run. The `train` command's flags, their checks and their help all come from here. Sections by concern:
data (where the data is), loader (how each rank reads it), augment (what an image goes through), optim, run."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from imagenet_train.choices import (
    AUTO_WARMUP,
    BATCH_SIZE,
    DEFAULT_DROP_PATH,
    EPOCH_BATCHES,
    REPEAT,
    SEED,
    WORKERS,
    Amp,
    AutoAugment,
    BrokenShardPolicy,
    CompileMode,
    Decoder,
    Interpolation,
    Loss,
    LrSchedule,
    Mode,
    Opt,
    Stem,
    Tracker,
    WarmupMethod,
    WeightsHead,
)
from imagenet_train.declarations import Setting, Trust, check, declared, member, sections_with, setting
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.limits import (
    COLLECTIVE_TIMEOUT,
    CROP_SIZE,
    IO_TIMEOUT,
    MAX_CLASSES,
    MAX_CORRUPT_STREAK,
    MAX_IMAGE_PIXELS,
    MIN_CROP_SCALE,
)
from imagenet_train.redact import redacted


@dataclass
class DataConfig:
    shards: str = setting("", "shard index (shards.json), its directory, or a URL to either", trust=Trust.PIPE)
    trust_index: bool = setting(
        False,
        "let the index name shards anywhere: absolute URLs, other hosts, local paths, file: and pipe: commands "
        "(off: only names inside the index's own folder; turn on only for an index you wrote yourself)",
        trust=Trust.WHEN_ON,
    )
    train_urls: str = setting(
        "",
        "training shards as a URL spec instead of an index, e.g. 'http://host/x-{000000..000146}.tar'",
        trust=Trust.PIPE,
    )
    val_urls: str = setting("", "validation shards as a URL spec (with --train-urls)", trust=Trust.PIPE)
    train_samples: int = setting(0, "samples in --train-urls (sets the epoch length)", minimum=0)
    num_classes: int = setting(0, "classes (0: from the index)", minimum=0)
    max_classes: int = setting(
        MAX_CLASSES,
        "refuse an index (or --num-classes) with more classes than this before building the model: the head and "
        "its optimizer state grow with them on every rank (ImageNet-21k has 21,841)",
        minimum=1,
        maximum=10_000_000,
    )


@dataclass
class LoaderConfig:
    mode: Mode = setting(
        Mode.RESAMPLED,
        "resampled: shards drawn at random, equal batches per rank; split: every sample once, under Join; "
        "queue: every sample once, shards handed out at run time to whichever rank is free",
        choices=Mode,
    )
    batch_size: int = setting(BATCH_SIZE, "batch size per rank", minimum=1, maximum=1 << 20)
    global_batch_size: int = setting(
        0,
        "samples per optimizer step over all ranks (what the LR scales with); when set, each rank's batch is this "
        "divided by world size x --grad-accum-steps, which must divide it (0: use --batch-size)",
        minimum=0,
        maximum=1 << 24,
    )
    workers: int = setting(WORKERS, "DataLoader workers per rank", minimum=0, maximum=512)
    decoder: Decoder = setting(
        Decoder.SIMPLEJPEG,
        "train-time JPEG decoder: simplejpeg (decode, then crop the uint8 image), fused (crop and DCT-scale "
        "inside libjpeg-turbo via PyTurboJPEG; needs libturbojpeg), pil, or dali (NVIDIA DALI decodes on the GPU "
        "with nvJPEG, fused with crop, flip and normalisation; its CPU backend without a GPU; "
        "pip install 'imagenet-train[dali]')",
        choices=Decoder,
    )
    shuffle_buffer: int = setting(1000, "samples in each shuffle buffer", minimum=0, maximum=1 << 24)
    epoch_batches: int = setting(
        EPOCH_BATCHES,
        "batches per rank per epoch (0: one pass over the data; split mode: cut every rank here)",
        minimum=0,
    )
    repeat: int = setting(
        REPEAT,
        "split mode: each worker reads its shards this many times per epoch (with --epoch-batches)",
        minimum=1,
    )
    ra_reps: int = setting(
        0,
        "repeated augmentation (torchvision's --ra-sampler --ra-reps, timm's --aug-repeats): each epoch reads a "
        "fresh 1/N share of the shards N times, each copy augmented on its own (split mode deals a shard's copies "
        "to N ranks; queue mode to whichever claim them), and the epoch stays one pass long; split and queue "
        "modes (0 or 1: off)",
        minimum=0,
        maximum=64,
    )
    io_timeout: float = setting(
        IO_TIMEOUT,
        "seconds to wait out an outage of the shard server or bucket (capped exponential backoff with jitter) "
        "before failing; long enough for a server pod to be rescheduled",
        minimum=0,
        maximum=7 * 24 * 3600,
    )
    on_broken_shard: BrokenShardPolicy = setting(
        BrokenShardPolicy.SKIP,
        "a truncated or corrupt shard: skip (keep the samples before the damage, count the rest as lost, warn) or fail",
        choices=BrokenShardPolicy,
    )
    verify_shards: bool = setting(
        True,
        "check every shard against the sha256 and size in the index while reading it (about 3 percent of the "
        "decode's CPU time); a mismatch is a broken shard, found at the shard's end (before use with "
        "--cache-dir); protects only as far as the index itself is trusted",
        trust=Trust.WHEN_OFF,
    )
    cache_dir: str = setting(
        "",
        "node-local directory to keep copies of remote shards in, so later epochs read local disk; with "
        "--verify-shards each shard is checked there before any of it is used",
    )
    cache_max_bytes: int = setting(
        0,
        "most bytes --cache-dir may hold on a node, shared by its ranks and workers: least recently used copies "
        "not being read are evicted to make room, a shard that cannot fit is read without caching (0: no limit)",
        minimum=0,
    )
    max_image_pixels: int = setting(
        MAX_IMAGE_PIXELS,
        "refuse images whose header claims more pixels than this before decoding them (a corrupt sample); "
        "bounds each worker's memory per image at pixels x 3 bytes (0: no cap)",
        minimum=0,
        maximum=1 << 32,
    )
    max_corrupt_streak: int = setting(
        MAX_CORRUPT_STREAK,
        "stop with an error when a DataLoader worker meets this many corrupt samples (images that do not decode, "
        "bad labels) in a row, or ends its share of an epoch without one good sample: the data is not what the "
        "decoder reads (0: only count them, as corrupt_samples in metrics.jsonl)",
        minimum=0,
        maximum=1 << 30,
    )
    loader_timeout: float = setting(
        1200.0,
        "seconds without a batch from the DataLoader workers before failing (0: wait forever); "
        "must exceed --io-timeout",
        minimum=0,
        maximum=7 * 24 * 3600,
    )


@dataclass
class AugmentConfig:
    train_crop_size: int = setting(
        CROP_SIZE, "training crop size (RandomResizedCrop)", minimum=1, maximum=8192, aliases=("image_size",)
    )
    val_resize_size: int = setting(
        0,
        "evaluation resize of the short side before the centre crop (0: the val crop size / 0.875)",
        minimum=0,
        maximum=16384,
        aliases=("val_resize",),
    )
    val_crop_size: int = setting(
        CROP_SIZE,
        "evaluation centre crop size; 224 whatever the train crop, as torchvision's --val-crop-size (0: the train "
        "crop size, FFCV-style, and what 0 meant in config.json files written before this default)",
        minimum=0,
        maximum=8192,
    )
    progressive_start_size: int = setting(
        0,
        "progressive resizing (FFCV): the train crop size up to --progressive-start-epoch, then a linear ramp "
        "in multiples of --progressive-step to --progressive-end-size (0: off, --train-crop-size throughout)",
        minimum=0,
        maximum=8192,
    )
    progressive_end_size: int = setting(
        0, "progressive resizing: the train crop size from --progressive-end-epoch on", minimum=0, maximum=8192
    )
    progressive_start_epoch: int = setting(0, "progressive resizing: the epoch the ramp starts at", minimum=0)
    progressive_end_epoch: int = setting(0, "progressive resizing: the epoch the ramp ends at", minimum=0)
    progressive_step: int = setting(
        32,
        "progressive resizing: the ramp's sizes are multiples of this (FFCV's 32 at ImageNet sizes; a ramp from "
        "14 to 28 px in 32s would jump from one end to the other)",
        minimum=1,
        maximum=8192,
    )
    min_crop_scale: float = setting(
        MIN_CROP_SCALE, "smallest image area fraction RandomResizedCrop keeps", above=0, maximum=1
    )
    hflip: bool = setting(True, "random horizontal flips")
    interpolation: Interpolation = setting(
        Interpolation.BILINEAR,
        "resampling of the training crop and the evaluation resize, with every --decoder (the --auto-augment "
        "policy stays bilinear): bilinear (torchvision's default) or bicubic (timm's, and the ViT and EfficientNet "
        "figures')",
        choices=Interpolation,
    )
    auto_augment: AutoAugment = setting(
        AutoAugment.NONE,
        "augmentation policy after the crop and flip, one entry each in loading/policies.py's POLICIES: "
        "torchvision.transforms.v2's class, and DALI's auto_aug with --decoder dali (a policy DALI lacks is refused "
        "there); docs/training.md names each",
        choices=AutoAugment,
    )
    random_erase: float = setting(
        0.0,
        "probability of RandomErasing each training image after the crop (erased to the mean pixel; "
        "torchvision's new recipe: 0.1; not with --decoder dali)",
        minimum=0,
        maximum=1,
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

    def eval_crop_size(self) -> int:
        """The evaluation centre crop: --val-crop-size (224 unless set), the train crop size when it is 0."""
        return self.val_crop_size or self.train_crop_size


@dataclass
class OptimConfig:
    opt: Opt = setting(
        Opt.SGD,
        "optimizer: sgd (torch SGD; with --nesterov, SGD+Nesterov), adamw (torch AdamW), lamb or lars (timm.optim's "
        "LAMB and LARS: pip install 'imagenet-train[timm]'); above a global batch of 8,192 plain SGD loses accuracy "
        "and MLPerf uses lars",
        choices=Opt,
    )
    lr: float = setting(
        0.1,
        "peak learning rate for a global batch of 256, scaled to the run's as timm's train.py scales --lr-base: "
        "linearly for sgd and lars (x global batch / 256), by the square root for adamw and lamb "
        "(x sqrt(global batch / 256)); the global batch is the optimizer's, --grad-accum-steps included",
        above=0,
        maximum=1e3,
    )
    momentum: float = setting(0.9, "momentum of sgd and lars", minimum=0, maximum=1)
    nesterov: bool = setting(False, "Nesterov momentum (sgd and lars)")
    fused_optimizer: bool = setting(
        False,
        "sgd and adamw's update as one fused kernel over every parameter (torch's fused=True), in place of torch's "
        "default on CUDA, a loop of multi-tensor kernels (foreach); the same update to rounding",
    )
    weight_decay: float = setting(
        1e-4,
        "weight decay of the weights; biases, norms and transformer embeddings take --bias-weight-decay, "
        "--norm-weight-decay and --transformer-embedding-decay, other one-dimensional parameters none "
        "(timm's rule); LARS and LAMB leave the undecayed ones unadapted",
        minimum=0,
        maximum=1,
    )
    label_smoothing: float = setting(0.1, "label smoothing", minimum=0, maximum=1)
    lr_schedule: LrSchedule = setting(
        LrSchedule.COSINE,
        "the LR after the warmup: cosine (down to --lr-end), step (torchvision's: x --lr-gamma every "
        "--lr-step-epochs epochs), poly (MLPerf's polynomial decay, power 2, down to --lr-end) or triangular "
        "(FFCV's: linear up to the peak at the end of the warmup, then linear down to 0 at the end)",
        choices=LrSchedule,
    )
    warmup_epochs: float = setting(
        AUTO_WARMUP,
        "epochs of linear warmup, counted in samples seen (epochs x the training samples, also under "
        "--epoch-batches and --total-samples); -1: auto, growing with the global batch: 1 epoch up to 1,638, "
        "linearly more up to Goyal et al.'s 5 epochs at 8,192 and above (global batch / 1,638.4, between 1 and 5)",
        minimum=AUTO_WARMUP,
        maximum=1e6,
    )
    lr_step_epochs: int = setting(
        30, "--lr-schedule step: epochs (of samples seen) between the LR's drops", minimum=1, maximum=1_000_000
    )
    lr_gamma: float = setting(0.1, "--lr-schedule step: the factor at each drop", above=0, maximum=1)
    lr_end: float = setting(
        0.0,
        "--lr-schedule cosine and poly: the LR at the end of the run (MLPerf's poly: 0.0001; torchvision's "
        "--lr-min, cosine's eta_min)",
        minimum=0,
        maximum=1e3,
        aliases=("lr_min",),
    )
    clip_grad_norm: float = setting(
        0.0,
        "clip the gradients' global L2 norm to this before each step (0: off); steadies large-batch and fp16 runs",
        minimum=0,
        maximum=1e6,
    )
    model_ema: bool = setting(
        False,
        "keep an exponential moving average of the weights (BN buffers included), evaluated beside the model and "
        "saved in every checkpoint; the final weights come from whichever has the better top-1",
    )
    model_ema_steps: int = setting(32, "update the EMA every N optimizer steps", minimum=1, maximum=1 << 20)
    model_ema_decay: float = setting(
        0.99998,
        "EMA decay per sample-epoch as torchvision gives it: the decay per update is adjusted for the optimizer's "
        "global batch (--grad-accum-steps included), --model-ema-steps and the epochs; during LR warmup the EMA "
        "copies the weights",
        minimum=0,
        maximum=1,
    )
    norm_weight_decay: float = setting(
        0.0,
        "weight decay of normalisation layers' parameters (torchvision's --norm-weight-decay; 0 as timm and "
        "torchvision's recipes; --weight-decay's value gives torchvision's default)",
        minimum=0,
        maximum=1,
    )
    bias_weight_decay: float = setting(
        0.0,
        "weight decay of the biases outside normalisation layers (torchvision's --bias-weight-decay; 0 as timm; "
        "torchvision's RN50 v2 decays the classifier's bias: --weight-decay's value)",
        minimum=0,
        maximum=1,
    )
    transformer_embedding_decay: float = setting(
        0.0,
        "weight decay of transformer embeddings: timm's model.no_weight_decay() names (pos_embed, cls_token) and "
        "torchvision's class_token, position_embedding, relative_position_bias_table "
        "(torchvision's --transformer-embedding-decay; 0 as timm)",
        minimum=0,
        maximum=1,
    )
    lr_warmup_method: WarmupMethod = setting(
        WarmupMethod.LINEAR,
        "the warmup's shape (torchvision's --lr-warmup-method): linear (from --lr-warmup-decay x the peak up to "
        "it) or constant (--lr-warmup-decay x the peak throughout)",
        choices=WarmupMethod,
    )
    lr_warmup_decay: float = setting(
        0.0,
        "the warmup's start as a fraction of the peak LR (torchvision's --lr-warmup-decay, whose default is 0.01; "
        "0: from 0, as Goyal et al.)",
        minimum=0,
        maximum=1,
    )
    grad_accum_steps: int = setting(
        1,
        "gradient accumulation: batches per optimizer step (timm's --grad-accum-steps); the global batch the LR, "
        "warmup and EMA scale with is --batch-size x ranks x this (--global-batch-size is that batch); DDP syncs "
        "gradients only on the last of them",
        minimum=1,
        maximum=1024,
    )
    loss: Loss = setting(
        Loss.CE,
        "training loss: ce (CrossEntropyLoss with --label-smoothing) or bce (timm's BinaryCrossEntropy, ResNet "
        "Strikes Back; --label-smoothing smooths hard targets, MixUp/CutMix's soft targets are taken as they are)",
        choices=Loss,
    )
    bce_target_threshold: float = setting(
        0.0,
        "--loss bce: binarise the targets above this (timm's --bce-target-thresh, RSB's A1/A2: 0.2; 0: off)",
        minimum=0,
        maximum=1,
    )


@dataclass
class RunConfig:
    arch: str = setting(
        "resnet50",
        "model: a torchvision name (resnet50), or timm/NAME for timm's (timm/resnet50d; "
        "pip install 'imagenet-train[timm]')",
    )
    zero_init_residual: bool = setting(
        False,
        "zero the scale (gamma) of the last BN in each residual block, so each block starts as the identity "
        "(torchvision's ResNet family, timm's models with zero_init_last; an error for other archs); off: each "
        "library's default, off for torchvision's models as in its reference, timm's own zero_init_last default "
        "for timm's (on for its ResNets); off in every recipe here",
    )
    blurpool: bool = setting(
        False,
        "FFCV's BlurPool: a stride-1 blur (timm's BlurPool2d) before every strided convolution with 16 or more "
        "input channels (pip install 'imagenet-train[timm]')",
    )
    weights: str = setting(
        "",
        "initialise the model from this local file: a torchvision or timm state dict or one of our checkpoints, "
        "read with weights_only=True (DDP's module. and torch.compile's _orig_mod. prefixes are stripped); "
        "--resume takes precedence: a run resumed from a checkpoint takes every weight from it",
    )
    weights_head: WeightsHead = setting(
        WeightsHead.REFUSE,
        "a --weights head sized for another number of classes: refuse (an error naming it), or replace (load "
        "the rest and train a freshly initialised head)",
        choices=WeightsHead,
    )
    epochs: int = setting(90, "epochs to train", minimum=1, maximum=1_000_000)
    amp: Amp = setting(Amp.AUTO, "mixed precision: auto (bf16 on GPU, off on CPU), bf16, fp16, off", choices=Amp)
    channels_last: bool = setting(True, "channels-last memory format on GPU")
    compile: bool = setting(
        False,
        "torch.compile the model (first steps compile; not applied in split/queue mode across ranks, where "
        "Join shadows DDP's collectives)",
    )
    compile_mode: CompileMode = setting(
        CompileMode.DEFAULT,
        "torch.compile's mode under --compile: default (fused kernels), reduce-overhead (the fixed-size step "
        "replayed as a CUDA graph: fewer launches, more memory), max-autotune (kernel configurations searched "
        "while compiling, minutes, and CUDA graphs) or max-autotune-no-cudagraphs",
        choices=CompileMode,
    )
    seed: int = setting(SEED, "seed for weights, shard order and augmentation", minimum=0, maximum=2**63 - 1)
    run_dir: str = setting("runs/latest", "directory for config.json, metrics.jsonl and checkpoints")
    results: str = setting("", "gs://BUCKET/PREFIX to mirror the run directory to as training goes (and resume from)")
    resume: str = setting("", "'latest' (newest checkpoint in --run-dir) or a checkpoint path")
    collective_timeout: float = setting(
        COLLECTIVE_TIMEOUT,
        "seconds a collective waits before the others leave naming the rank and host that stopped answering (exit "
        "138); at least --loader-timeout (1200 s by default): a rank riding out an outage holds the others in one",
        minimum=10,
        maximum=7 * 24 * 3600,
    )
    eval_every: int = setting(1, "evaluate every N epochs (and after the last)", minimum=1)
    val_tta: bool = setting(
        False,
        "test-time flip: evaluate on each image and its horizontal mirror and average the two logits (FFCV's lr_tta)",
    )
    checkpoint_every: int = setting(
        0, "also checkpoint every N batches inside an epoch, for mid-epoch resume (0: epoch ends only)", minimum=0
    )
    keep_checkpoints: int = setting(
        0,
        "keep only the newest N whole-epoch checkpoints in RUN_DIR/checkpoints: after each new one is written, "
        "older epochs' are removed, never one newer than it (0: keep every epoch's, as torchvision; the --results "
        "bucket keeps every one either way)",
        minimum=0,
        maximum=1_000_000,
    )
    log_keys: bool = setting(False, "debug: record every sample key read, per rank and epoch, under RUN_DIR/keys")
    metrics_port: int = setting(
        0,
        "serve Prometheus metrics at /metrics on this port plus the local rank, on every interface (0: off); see "
        "docs/metrics.md",
        minimum=0,
        maximum=65535 - 1024,
    )
    total_samples: int = setting(
        0,
        "train for this many samples instead of --epochs (resampled mode; evaluation, checkpoints and metrics "
        "every --epoch-batches batches)",
        minimum=0,
    )
    force: bool = setting(False, "run even when the pre-flight check says the configuration will hang")
    preflight: bool = setting(
        False,
        "before training, check every rank's node: its GPU computes a known matmul and reports free memory, an "
        "all-reduce over the world reaches --preflight-min-busbw, the shard index answers, the run directory "
        "has room for two checkpoints (imagenet-train preflight runs the same checks alone); a failure names "
        "rank and host in one line each and exits 3; docs/preflight.md",
    )
    preflight_min_busbw: float = setting(
        0.0,
        "the all-reduce bus bandwidth in GB/s (as nccl-tests reports busbw) that --preflight and imagenet-train "
        "preflight require over the world (0: measured and reported only)",
        minimum=0,
        maximum=100_000,
    )
    tensorboard: bool = setting(
        True,
        "write TensorBoard events (loss, LR, top-1/top-5, img/s, data wait, per-rank batches) under "
        "RUN_DIR/tensorboard",
    )
    drop_path: float = setting(
        DEFAULT_DROP_PATH,
        "stochastic depth: timm's drop_path_rate, torchvision's stochastic_depth_prob (EfficientNet and ConvNeXt; "
        "Swin's and MaxViT's builders fix it); -1: the model's own default (timm's 0, torchvision's builder's, "
        "e.g. 0.2 for efficientnet_b0)",
        minimum=DEFAULT_DROP_PATH,
        maximum=0.99,
    )
    sync_bn: bool = setting(
        False,
        "BatchNorm statistics over all ranks (torch.nn.SyncBatchNorm.convert_sync_batchnorm), on CUDA across "
        "ranks only: refused on CPU, where torch's SyncBatchNorm does not run",
    )
    stem: Stem = setting(
        Stem.IMAGENET,
        "a ResNet's stem (torchvision's ResNet family, timm's ResNets): imagenet (the architecture's own, 7x7 "
        "stride 2 and a max-pool: a 32 px image is 8x8 at the first block), or small (a 3x3 stride-1 conv, no "
        "max-pool, as CIFAR ResNets: for images of 64 px or less; its blocks then do 16x the work)",
        choices=Stem,
    )
    resnet_width: int = setting(
        0,
        "channels of a timm ResNet's first stage, doubled at each stage after it (16: 16, 32, 64, 128, a sixteenth "
        "of ResNet-18's block compute); 0: the architecture's own (64); for timm's ResNets only (--arch timm/resnet18)",
        minimum=0,
        maximum=4096,
    )
    tracker: Tracker = setting(
        Tracker.NONE,
        "experiment tracker that rank 0 sends the params, each epoch's metrics and the final checkpoint's location "
        "to, resumed into the same tracker run by --resume: mlflow (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME; "
        "pip install 'imagenet-train[mlflow]'), wandb (WANDB_PROJECT, WANDB_MODE, WANDB_DIR; "
        "pip install 'imagenet-train[wandb]') or none; a tracker that is down never stops training",
        choices=Tracker,
    )


_Config = TypeVar("_Config", bound="Config")  # for_world keeps the class it is given (a checked Config stays one)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def sections(self) -> tuple[DataConfig, LoaderConfig, AugmentConfig, OptimConfig, RunConfig]:
        """The five sections, in the order config.json writes them."""
        return self.data, self.loader, self.augment, self.optim, self.run

    def with_values(self, values: Mapping[str, Any]) -> Config:
        """A plain (unchecked) Config of these settings and `values`, named flat (batch_size); an unknown name is one
        line. validate() and the entry checks come after, as for any Config."""
        return Config(**sections_with(self, values))

    def to_json(self) -> str:
        """Every setting, by section, as config.json, each checkpoint and the tracker's params hold it: others may
        read those, so a URL's user info and signed query values are redacted (redact.py)."""
        return json.dumps(redacted(dataclasses.asdict(self)), indent=1)

    def for_world(self: _Config, world_size: int) -> _Config:
        """This config with each rank's batch derived from --global-batch-size (when set) for `world_size` ranks: the
        optimizer's batch, so each rank takes global / (ranks x --grad-accum-steps) per loader step."""
        total, accumulate = self.loader.global_batch_size, self.optim.grad_accum_steps
        if not total:
            return self
        if total % (world_size * accumulate):
            over = f"{world_size} ranks" + (f" x {accumulate} --grad-accum-steps" if accumulate > 1 else "")
            raise ImagenetTrainError(
                f"--global-batch-size: {total} does not divide over {over}; expected a multiple of "
                f"{world_size * accumulate}"
            )
        batch = total // (world_size * accumulate)
        return dataclasses.replace(self, loader=dataclasses.replace(self.loader, batch_size=batch))

    def validate(self) -> Config:
        """Reject a setting out of its range or closed set, naming the option; a closed set's word given as text
        (from code or a file) becomes its enum member. The checks across settings: config_checks.checked."""
        for section in self.sections():
            for declaration, rule in declared(section):
                kind, value = type(declaration.default), getattr(section, declaration.name)
                check(declaration.name, kind, rule, value)
                setattr(section, declaration.name, member(kind, value))
        return self


SECTIONS = (DataConfig, LoaderConfig, AugmentConfig, OptimConfig, RunConfig)


def defaults() -> dict[str, Any]:
    """Every setting's default, by name."""
    return {d.name: d.default for section in SECTIONS for d, _ in declared(section)}


def declaration(name: str) -> tuple[dataclasses.Field, Setting]:
    """A declared setting by name, for the commands besides `train` that take its flag (plan, probe, summarize)."""
    return next((d, rule) for section in SECTIONS for d, rule in declared(section) if d.name == name)
