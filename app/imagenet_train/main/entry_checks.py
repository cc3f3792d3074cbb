"""The checks every entry point (train, evaluate, Ray, Lightning) runs before it starts: the settings in range and
working together (config_checks.checked, on the ground floor), then what this installation must have for them, each
from the layer that owns it: a reader for every URL's scheme and a writer for --results' (io/schemes.py), the
decoder's library and the augmentation policy's builder (loading/installed.py), the tracker's library and its
transport (rundir/trackers.py), timm for the optimizers and the loss that need it.

The checks run once, at the boundary: the command's check hook (commands/), the launcher's entry (Ray's `run` and each
of its workers, Lightning's data module), or the caller's own `runnable(cfg)` in a notebook. What they return is a
RunnableConfig, the type `train()` and `evaluate_weights()` take: mypy holds typed callers to it, and a plain Config
handed to either (from an untyped caller) is refused in one line rather than checked there again, so the run itself
never descends into the checks."""

from __future__ import annotations

import copy
import dataclasses
import json

from imagenet_train.choices import TIMM_OPTS, Loss, Opt
from imagenet_train.config import Config
from imagenet_train.config_checks import checked
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.schemes import check_settings
from imagenet_train.loading.installed import check_pipeline
from imagenet_train.rundir.trackers import check_installed


class RunnableConfig(Config):
    """A Config that `runnable` checked: its settings in range and working together, and this installation able to
    run them. `runnable` makes it as a copy, so a later change to the Config it was made from does not reach it, and
    notes its values: an entry refuses one changed since (`refuse_unchecked`). Change a setting before the checks."""

    checked_values = ""  # the values `runnable` checked; a RunnableConfig made any other way has none


class UncheckedConfig(ImagenetTrainError):
    """A Config handed to an entry that takes a RunnableConfig, unchecked or changed since its checks."""

    def __init__(self, entry: str):
        self.entry = entry
        super().__init__(
            f"{entry}: the Config has not been through the entry checks, or was changed after them; expected the "
            f"RunnableConfig that imagenet_train.main.entry_checks.runnable(cfg) returns (cfg = runnable(cfg), then "
            f"{entry}(cfg), with no setting changed in between)"
        )

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return type(self), (self.entry,)  # pickled (Ray, multiprocessing) as made, not from its message


def runnable(cfg: Config) -> RunnableConfig:
    """`cfg` once its settings are checked (config_checks.checked) and this installation can run them."""
    checked(cfg)
    check_settings(cfg.data.shards, cfg.data.train_urls, cfg.data.val_urls, cfg.run.results)
    check_pipeline(cfg.loader, cfg.augment)
    _check_timm(cfg)
    check_installed(cfg.run.tracker)
    kept = copy.deepcopy(cfg)
    made = RunnableConfig(**{part.name: getattr(kept, part.name) for part in dataclasses.fields(Config)})
    made.checked_values = _values(made)
    return made


def refuse_unchecked(cfg: Config, entry: str) -> None:
    """Refuse, in one line, a Config `runnable` did not hand back, or one changed since it did (an untyped caller's:
    mypy holds the typed ones to RunnableConfig)."""
    if not isinstance(cfg, RunnableConfig) or not cfg.checked_values or cfg.checked_values != _values(cfg):
        raise UncheckedConfig(entry)


def _values(cfg: Config) -> str:
    return json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str)


def _check_timm(cfg: Config) -> None:
    """The [timm] extra, for the optimizers and the loss that come from timm."""
    from imagenet_train.compat import require_timm

    if Opt(cfg.optim.opt) in TIMM_OPTS:
        require_timm(f"--opt {cfg.optim.opt}")
    if cfg.optim.loss == Loss.BCE:
        require_timm("--loss bce")
