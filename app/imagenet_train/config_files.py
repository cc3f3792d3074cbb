"""Settings read from a file, each checked by its declaration: `train --config FILE` (a recipe), a run's
config.json, the chart's `train:` values. A file is data: what runs a command or widens trust comes from the
command line only (docs/security.md)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from imagenet_train.config import SECTIONS, Config
from imagenet_train.declarations import Setting, Trust, canonical_names, declared, did_you_mean, flag, problem
from imagenet_train.errors import ImagenetTrainError, clip
from imagenet_train.redact import MARK, is_redacted, redact
from imagenet_train.yaml_input import read_mapping

# config.json's sections by key, in its order (data, loader, augment, optim, run).
SECTION_NAMES = tuple(f.name for f in dataclasses.fields(Config))


def settings_from(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A config file's settings, checked: flat names (`batch_size: 64`), or a run's config.json sections, today's
    or those of runs written before the data section was split (data, optim, run): a setting's name is its key."""
    if set(values) <= {*SECTION_NAMES, "derived"} and all(isinstance(v, dict) for v in values.values()):
        values = {k: v for name in SECTION_NAMES for k, v in values.get(name, {}).items()}
    kinds: dict[str, tuple[type, Setting]] = {
        d.name: (type(d.default), rule) for section in SECTIONS for d, rule in declared(section)
    }
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


def load_settings(path: str | Path, given: Collection[str] = ()) -> dict[str, Any]:
    """The settings in a YAML or JSON config file (`train --config FILE`), checked, and checked to be data
    (`check_data`) but for the settings the command line gives (`given`), whose file values go unused."""
    source = f"--config {path}"
    settings = settings_from(read_mapping(path, "--config"), source)
    check_data({name: value for name, value in settings.items() if name not in given}, source)
    return settings


# What a value that a file may not set would do, by its setting's Trust.
WIDENS = {
    Trust.WHEN_ON: "widens what is trusted",
    Trust.WHEN_OFF: "turns a check of untrusted input off",
    Trust.PIPE: "names a pipe: command for the shell to run",
}


def check_data(settings: Mapping[str, Any], source: str) -> None:
    """Refuse, in one line naming `source` and the key, a file's value that runs a command or widens trust (its
    declaration's `trust`), or one that a record redacted: the command line must give those."""
    rules = _rules()
    for name, value in settings.items():
        rule = rules[name]
        if rule.widens(value) and rule.trust:
            shown = json.dumps(value) if isinstance(value, bool) else f"'{clip(redact(value))}'"
            raise ImagenetTrainError(
                f"{source}: {name}: {shown} {WIDENS[rule.trust]}, which a file may not set; "
                f"pass {flag_for(name, value)} on the command line if you mean it"
            )
        if isinstance(value, str) and is_redacted(value):
            raise ImagenetTrainError(
                f"{source}: {name}: '{clip(value)}' holds a secret that the record redacted ({MARK}); "
                f"pass {flag(name)} with the real value on the command line"
            )


def flag_for(name: str, value: Any) -> str:
    """The flag that gives `value` to setting `name`: --trust-index, --no-verify-shards, --val-urls VALUE."""
    if isinstance(value, bool):
        return flag(name) if value else "--no-" + flag(name)[2:]
    return f"{flag(name)} VALUE"


def command_line_only(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings (checked, by name) whose values only a command line may give."""
    rules = _rules()
    return {name: value for name, value in settings.items() if rules[name].widens(value)}


def _rules() -> dict[str, Setting]:
    return {d.name: rule for section in SECTIONS for d, rule in declared(section)}
