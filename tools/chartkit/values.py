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
from .formats import described


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
    """Every schema violation as 'field: what was expected', one per field, most specific first."""
    try:
        import jsonschema
    except ImportError:  # pragma: no cover
        raise ImagenetTrainError("jsonschema is missing: pip install 'imagenet-train[deploy]'") from None
    strict = jsonschema.validators.extend(jsonschema.Draft7Validator, {"pattern": _ecma_pattern})
    found: dict[str, tuple[bool, str]] = {}  # field -> (from a rule, message): a key's own schema speaks first
    for error in strict(schema).iter_errors(values):
        for field, message, ruled in _explained(error, schema, strict):
            if field not in found or (found[field][0] and not ruled):
                found[field] = (ruled, message)
    return [f"{field}: {found[field][1]}" for field in sorted(found, key=_order)]


def _order(field: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"[.\[\]]+", field) if part]


def _explained(error: Any, schema: dict, strict: Any) -> Iterable[tuple[str, str, bool]]:
    """(field, what was expected, whether a rule across keys said so) for one of jsonschema's errors."""
    import jsonschema

    rule = _broken_rule(schema, error.absolute_schema_path)
    if rule is not None:
        # The keys of the rule's `then` that fail, each with the rule's own words (chart_schema.rule).
        scope, expected = list(error.absolute_path), rule["then"]["else"]["required"][0]
        broken = [
            [*inner.absolute_path, *([inner.validator_value[0]] if inner.validator == "required" else [])]
            for inner in strict(rule["then"]["if"]).iter_errors(error.instance)
        ]
        for path in broken or [[]]:
            yield _field([*scope, *path]), expected, True
        return
    deepest = jsonschema.exceptions.best_match([error]) if error.context else error
    path = list(deepest.absolute_path)
    if deepest.validator == "additionalProperties":
        unknown = sorted(set(deepest.instance) - set(deepest.schema.get("properties", {})))
        yield _field(path + unknown[:1]), "unknown key (not in values.schema.json)", False
    elif error.validator in ("anyOf", "oneOf", "pattern", "const") and not isinstance(error.instance, dict):
        # jsonschema's words for these name no expectation ("... is not valid under any of the given schemas")
        yield (
            _field(list(error.absolute_path)),
            f"expected {described(error.schema)}, got {_shown(error.instance)}",
            False,
        )
    else:
        yield _field(path), _clipped(deepest), False


def _broken_rule(schema: dict, schema_path: Iterable[Any]) -> dict | None:
    """The rule (an if/then with a $comment) whose `then` the error's schema path runs through, if any."""
    node: Any = schema
    for part in schema_path:
        if part == "then" and isinstance(node, dict) and "$comment" in node and "if" in node:
            return node
        node = node[part]
    return None


def _clipped(error) -> str:
    """jsonschema's message with the value it quotes cut to errors.clip's length (it quotes the whole value)."""
    quoted = repr(error.instance)
    if len(quoted) > CLIP and error.message.startswith(quoted):
        shown = repr(clip(error.instance)) if isinstance(error.instance, str) else clip(error.instance)
        return shown + error.message[len(quoted) :]
    return error.message


def _shown(value: Any) -> str:
    return repr(clip(value)) if isinstance(value, str) else clip(json.dumps(value))


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
