"""The checks across settings that each setting's own declaration cannot make (a decoder's or a tracker's library,
an optimizer that needs timm, sizes that contradict each other), each refused in one line naming the flags. The
planner's verdict with the data's shard sizes and the world is planning/plan.py's (`preflight_check`)."""

from __future__ import annotations

from imagenet_train.choices import AUTO_WARMUP, MOMENTUM_OPTS, TIMM_OPTS, Decoder, Loss, Mode, Opt, WarmupMethod
from imagenet_train.config import AugmentConfig, Config
from imagenet_train.errors import ImagenetTrainError, clip
from imagenet_train.rundir.trackers import check_installed


def checked(cfg: Config) -> Config:
    """`cfg` once every setting is in range (Config.validate) and they can work together: what every entry point
    (train, evaluate, Ray, Lightning) runs before it starts."""
    check_combinations(cfg.validate())
    return cfg


def check_combinations(cfg: Config) -> None:
    """Refuse a run's Config whose settings cannot work together."""
    data, loader = cfg.data, cfg.loader
    if not data.shards and not data.train_urls:
        raise ImagenetTrainError("--shards: give a shard index (or --train-urls)")
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
    _check_optimizer(cfg)
    _check_resolution(cfg.augment, loader.decoder)
    _check_policy(cfg.augment, loader.decoder)
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
    check_installed(cfg.run.tracker)


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
    """The optimizer's cross-field checks, and the [timm] extra for the optimizers that need it."""
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
    if opt in TIMM_OPTS:
        from imagenet_train.compat import require_timm

        require_timm(f"--opt {opt}")


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
    if optim.loss == Loss.BCE:
        from imagenet_train.compat import require_timm

        require_timm("--loss bce")


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


def _check_policy(augment: AugmentConfig, decoder: Decoder) -> None:
    """The --auto-augment word has its entry in the one table both paths read, and a DALI builder there under
    --decoder dali; else one line."""
    from imagenet_train.loading.policies import dali_builder, policy_entry

    policy_entry(augment.auto_augment)
    if decoder == Decoder.DALI:
        dali_builder(augment.auto_augment)
