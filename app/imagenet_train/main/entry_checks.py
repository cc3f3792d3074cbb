"""The checks every entry point (train, evaluate, Ray, Lightning) runs before it starts: the settings in range and
working together (config_checks.checked, on the ground floor), then what this installation must have for them, each
from the layer that owns it: a reader for every URL's scheme and a writer for --results' (io/schemes.py), the
decoder's library and the augmentation policy's builder (loading/installed.py), the tracker's library and its
transport (rundir/trackers.py), timm for the optimizers and the loss that need it."""

from __future__ import annotations

from imagenet_train.choices import TIMM_OPTS, Loss, Opt
from imagenet_train.config import Config
from imagenet_train.config_checks import checked
from imagenet_train.io.schemes import check_settings
from imagenet_train.loading.installed import check_pipeline
from imagenet_train.rundir.trackers import check_installed


def runnable(cfg: Config) -> Config:
    """`cfg` once its settings are checked (config_checks.checked) and this installation can run them."""
    checked(cfg)
    check_settings(cfg.data.shards, cfg.data.train_urls, cfg.data.val_urls, cfg.run.results)
    check_pipeline(cfg.loader, cfg.augment)
    _check_timm(cfg)
    check_installed(cfg.run.tracker)
    return cfg


def _check_timm(cfg: Config) -> None:
    """The [timm] extra, for the optimizers and the loss that come from timm."""
    from imagenet_train.compat import require_timm

    if Opt(cfg.optim.opt) in TIMM_OPTS:
        require_timm(f"--opt {cfg.optim.opt}")
    if cfg.optim.loss == Loss.BCE:
        require_timm("--loss bce")
