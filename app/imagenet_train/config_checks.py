"""The checks across settings that each setting's own declaration cannot make (sizes that contradict each other,
an option that applies to another one's choice only), each refused in one line naming the flags. On the ground floor
beside config.py: pure, importing only the settings, their closed sets and errors. What this installation must have
for the settings (a decoder's, a tracker's or timm's library, the augmentation policy's builder) is checked by the
layers that own it, all at once in main/entry_checks.py (`runnable`), which every entry point runs. The planner's
verdict with the data's shard sizes and the world is planning/plan.py's (`preflight_check`)."""

from __future__ import annotations

from imagenet_train.choices import (
    AUTO_WARMUP,
    FUSED_OPTS,
    MOMENTUM_OPTS,
    CompileMode,
    Decoder,
    Loss,
    Mode,
    Opt,
    WarmupMethod,
)
from imagenet_train.config import AugmentConfig, Config
from imagenet_train.errors import ImagenetTrainError, clip


def checked(cfg: Config) -> Config:
    """`cfg` once every setting is in range (Config.validate) and they can work together (entry points run it through
    main/entry_checks.py's `runnable`, which also asks for the libraries the settings need)."""
    check_combinations(cfg.validate())
    return cfg


def check_combinations(cfg: Config) -> None:
    """Refuse a run's Config whose settings cannot work together."""
    data, loader = cfg.data, cfg.loader
    if not data.shards and not data.train_urls:
        raise ImagenetTrainError("--shards: give a shard index (or --train-urls)")
    _check_optimizer(cfg)
    _check_resolution(cfg.augment, loader.decoder)
    if loader.ra_reps > 1 and loader.mode == Mode.RESAMPLED:
        raise ImagenetTrainError(
            f"--ra-reps {loader.ra_reps}: needs --mode split or queue (resampled mode draws shards at random already)"
        )
    if cfg.run.total_samples and loader.mode != Mode.RESAMPLED:
        raise ImagenetTrainError("--total-samples: needs --mode resampled (an endless stream of equal batches)")
    if loader.loader_timeout and loader.loader_timeout <= loader.io_timeout:
        raise ImagenetTrainError(
            f"--loader-timeout: {loader.loader_timeout:g} s would give up before --io-timeout {loader.io_timeout:g} s "
            "has waited out an outage; expected 0 (wait forever) or more than --io-timeout"
        )
    _check_collective_timeout(cfg)
    _check_step_kernels(cfg)


def _check_step_kernels(cfg: Config) -> None:
    """--compile-mode needs --compile; --fused-optimizer needs an optimizer torch fuses."""
    mode, opt = CompileMode(cfg.run.compile_mode), Opt(cfg.optim.opt)
    if mode != CompileMode.DEFAULT and not cfg.run.compile:
        raise ImagenetTrainError(f"--compile-mode {mode}: applies under --compile; add --compile or drop it")
    if cfg.optim.fused_optimizer and opt not in FUSED_OPTS:
        fused = " or ".join(str(name) for name in FUSED_OPTS)
        raise ImagenetTrainError(f"--fused-optimizer: torch fuses --opt {fused}, not --opt {opt}; drop it")


def _check_collective_timeout(cfg: Config) -> None:
    """--collective-timeout outlasts a rank's longest legitimate wait for a batch, during which the others wait in
    the step's collective: a survivable outage must not end the run as a hang."""
    loader, limit = cfg.loader, cfg.run.collective_timeout
    longest, name = (
        (loader.loader_timeout, "--loader-timeout") if loader.loader_timeout else (loader.io_timeout, "--io-timeout")
    )
    if limit < longest:
        raise ImagenetTrainError(
            f"--collective-timeout: {limit:g} s would end the run while a rank rides out an outage ({name} "
            f"{longest:g} s) and the others wait for it in a collective; expected at least {longest:g}, or a lower "
            f"{name}"
        )


def _check_optimizer(cfg: Config) -> None:
    """The optimizer's cross-field checks."""
    optim, opt = cfg.optim, Opt(cfg.optim.opt)
    if optim.warmup_epochs < 0 and optim.warmup_epochs != AUTO_WARMUP:
        raise ImagenetTrainError(
            f"--warmup-epochs: expected -1 (auto) or a number >= 0, got '{clip(optim.warmup_epochs)}'"
        )
    _check_recipe_settings(cfg)
    if optim.nesterov and opt not in MOMENTUM_OPTS:
        raise ImagenetTrainError(f"--nesterov: applies to --opt sgd and lars, not --opt {opt}; drop it")
    if optim.nesterov and not optim.momentum:
        raise ImagenetTrainError("--nesterov: needs a momentum; expected --momentum above 0")
    if opt not in MOMENTUM_OPTS and cfg.loader.mode != Mode.RESAMPLED:
        # After Join only the momentum buffers are copied from a rank that ran every step (hooks.sync_optimizer_state).
        raise ImagenetTrainError(
            f"--opt {opt}: --mode {cfg.loader.mode} keeps replicas in step for SGD and LARS momentum only; "
            "expected --mode resampled (or --opt sgd or lars)"
        )


def _check_recipe_settings(cfg: Config) -> None:
    """The warmup shape, drop-path and BCE settings that cannot go together."""
    optim = cfg.optim
    if optim.lr_warmup_method == WarmupMethod.CONSTANT and not optim.lr_warmup_decay:
        raise ImagenetTrainError(
            "--lr-warmup-method constant: holds the LR at --lr-warmup-decay x the peak, which is 0; expected "
            "--lr-warmup-decay above 0 (torchvision's default: 0.01)"
        )
    if cfg.run.drop_path < 0 and cfg.run.drop_path != -1:
        raise ImagenetTrainError(
            f"--drop-path: expected -1 (the model's default) or a number >= 0, got '{clip(cfg.run.drop_path)}'"
        )
    if optim.bce_target_threshold and optim.loss != Loss.BCE:
        raise ImagenetTrainError("--bce-target-threshold: applies to --loss bce only; drop it or add --loss bce")


def _check_resolution(augment: AugmentConfig, decoder: Decoder) -> None:
    """The sizes and augmentations that cannot go together, each refused in one line."""
    if bool(augment.progressive_start_size) != bool(augment.progressive_end_size):
        raise ImagenetTrainError(
            "--progressive-start-size/--progressive-end-size: give both (progressive resizing) or neither"
        )
    if augment.progressive_end_epoch < augment.progressive_start_epoch:
        raise ImagenetTrainError(
            f"--progressive-end-epoch: {augment.progressive_end_epoch} is before --progressive-start-epoch "
            f"{augment.progressive_start_epoch}; expected a ramp that ends at or after it starts"
        )
    if augment.val_resize_size and augment.val_resize_size < augment.eval_crop_size():
        raise ImagenetTrainError(
            f"--val-resize-size: {augment.val_resize_size} is smaller than the val crop {augment.eval_crop_size()}; "
            "expected a resize at least as large as the crop"
        )
    if augment.random_erase and decoder == Decoder.DALI:
        raise ImagenetTrainError(
            "--random-erase: not available with --decoder dali (DALI has no RandomErasing); "
            "use another --decoder or --random-erase 0"
        )
