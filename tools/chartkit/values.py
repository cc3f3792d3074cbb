"""The chart's values, the way Helm sees them: defaults, then -f files in order; checked by the chart's own
values.schema.json and by the cross-field rules the pods' `launch` also applies (imagenet_train.deployment).

tools/render.py and tools/ngc.py never accept values Helm or the pods would reject. `--set` is Helm's own
syntax and stays Helm's: write a values file instead.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from imagenet_train.deployment import problems as deployment_problems
from imagenet_train.errors import CLIP, ImagenetTrainError, clip
from imagenet_train.yaml_input import read_mapping

from . import CHART_DIR


def load_yaml(path: str | Path) -> dict:
    """A values file as a mapping; an empty file is {}."""
    return read_mapping(path, "values file")


def coalesce(base: dict, override: dict) -> dict:
    """Helm's merge: maps merge recursively, anything else replaces, null deletes the key."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = coalesce(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _field(path: Iterable[Any]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: dict) -> Iterable[Any]:
    """JSON Schema's `pattern` as Helm's Go engine reads it: `$` is the end of the text.

    Python's `$` also matches before a final newline, so 'name\\n' would pass a pattern Helm refuses.
    """
    import jsonschema

    if isinstance(instance, str) and not re.search(re.sub(r"(?<!\\)\$", r"\\Z", pattern), instance):
        yield jsonschema.ValidationError(f"{instance[:60]!r} does not match {pattern!r}")


def schema_errors(values: dict, schema: dict) -> list[str]:
    """Every schema violation as 'field: what was expected', most specific first."""
    try:
        import jsonschema
    except ImportError:  # pragma: no cover
        raise ImagenetTrainError("jsonschema is missing: pip install 'imagenet-train[deploy]'") from None
    strict = jsonschema.validators.extend(jsonschema.Draft7Validator, {"pattern": _ecma_pattern})
    validator = strict(schema)
    messages = []
    for error in sorted(validator.iter_errors(values), key=lambda e: list(e.absolute_path)):
        deepest = jsonschema.exceptions.best_match([error]) if error.context else error
        path = list(deepest.absolute_path)
        if deepest.validator == "additionalProperties":
            unknown = sorted(set(deepest.instance) - set(deepest.schema.get("properties", {})))
            path += unknown[:1]
            messages.append(f"{_field(path)}: unknown key (not in values.schema.json)")
        else:
            messages.append(f"{_field(path)}: {_clipped(deepest)}")
    return messages


def _clipped(error) -> str:
    """jsonschema's message with the value it quotes cut to errors.clip's length (it quotes the whole value)."""
    quoted = repr(error.instance)
    if len(quoted) > CLIP and error.message.startswith(quoted):
        shown = repr(clip(error.instance)) if isinstance(error.instance, str) else clip(error.instance)
        return shown + error.message[len(quoted) :]
    return error.message


def load_values(files: Iterable[str] = (), chart_dir: Path = CHART_DIR) -> dict:
    """Chart defaults + files, validated; raises ImagenetTrainError naming the first bad field."""
    values = load_yaml(chart_dir / "values.yaml")
    for path in files:
        values = coalesce(values, load_yaml(path))
    schema = json.loads((chart_dir / "values.schema.json").read_text())
    problems = schema_errors(values, schema)
    if problems:
        raise ImagenetTrainError(
            f"values: {problems[0]}" + (f" (and {len(problems) - 1} more)" if problems[1:] else "")
        )
    problems = deployment_problems(values)
    if problems:
        raise ImagenetTrainError(problems[0])
    return values
