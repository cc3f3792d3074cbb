"""Settings read from a file, each checked by its declaration: `train --config FILE` (a recipe), a run's
config.json, the chart's `train:` values."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imagenet_train.config import SECTIONS
from imagenet_train.declarations import canonical_names, declared, did_you_mean, flag, problem
from imagenet_train.errors import ImagenetTrainError, clip
from imagenet_train.yaml_input import read_mapping


def settings_from(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A config file's settings, checked: flat names (`batch_size: 64`), or a run's config.json sections."""
    if set(values) <= {"data", "optim", "run", "derived"} and all(isinstance(v, dict) for v in values.values()):
        values = {k: v for name in ("data", "optim", "run") for k, v in values.get(name, {}).items()}
    kinds = {d.name: (type(d.default), rule) for section in SECTIONS for d, rule in declared(section)}
    renamed = canonical_names(SECTIONS)
    checked = {}
    for given, value in values.items():
        name = renamed.get(given, given)
        if name in checked or (name != given and name in values):
            raise ImagenetTrainError(f"{source}: {clip(given)} and {name} name the same setting; expected only {name}")
        if name not in kinds:
            raise ImagenetTrainError(
                f"{source}: unknown setting '{clip(name)}'; expected a `train` option name with underscores, "
                "e.g. batch_size for --batch-size" + did_you_mean(str(name), [*kinds, *renamed])
            )
        kind, rule = kinds[name]
        wanted = problem(kind, rule, value)
        if wanted:
            raise ImagenetTrainError(f"{source}: {name} ({flag(name)}): expected {wanted}, got '{clip(value)}'")
        checked[name] = kind(value)
    return checked


def load_settings(path: str | Path) -> dict[str, Any]:
    """The settings in a YAML or JSON config file (`train --config FILE`), checked."""
    return settings_from(read_mapping(path, "--config"), f"--config {path}")
