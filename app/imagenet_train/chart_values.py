"""The chart's values, the way Helm sees them: defaults, -f files in order, then --set; checked by the
chart's own values.schema.json and the cross-field rules its templates `fail` on.

One source of truth for tools/render.py and tools/ngc.py: they never accept values Helm would reject.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .errors import ImagenetTrainError

CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "imagenet-train"


def _yaml():
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML comes with the deploy extra
        raise ImagenetTrainError("PyYAML is missing: pip install 'imagenet-train[deploy]'") from None
    return yaml


def load_yaml(path: str | Path) -> dict:
    """A values file as a mapping; an empty file is {}."""
    yaml = _yaml()
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ImagenetTrainError(f"{path}: cannot read values file ({error.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ImagenetTrainError(f"{path}: not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ImagenetTrainError(f"{path}: expected a mapping of values, got {type(data).__name__}")
    return data


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


# --set, as Helm's strvals parses it: a.b=v, a[0]=v, {x,y} lists, \, and \. escapes, typed scalars.
_SPLIT = re.compile(r"(?<!\\),(?![^{]*\})")


def _typed(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if re.fullmatch(r"-?(0|[1-9][0-9]*)", text):
        return int(text)
    return text.replace("\\,", ",")


def _path(key: str, expression: str) -> list[str | int]:
    parts: list[str | int] = []
    for piece in re.split(r"(?<!\\)\.", key):
        match = re.fullmatch(r"([^\[\]]*)((?:\[\d+\])*)", piece)
        if not match or not match.group(1):
            raise ImagenetTrainError(f"--set {expression}: cannot parse key '{key}'")
        parts.append(match.group(1).replace("\\.", "."))
        parts.extend(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))
    return parts


def _assign(tree: dict, path: list[str | int], value: Any) -> None:
    node: Any = tree
    for here, nxt in zip(path, path[1:], strict=False):
        empty: Any = [] if isinstance(nxt, int) else {}
        if isinstance(here, int):
            while len(node) <= here:
                node.append(None)
            if not isinstance(node[here], (dict, list)):
                node[here] = empty
            node = node[here]
        else:
            if not isinstance(node.get(here), (dict, list)):
                node[here] = empty
            node = node[here]
    last = path[-1]
    if isinstance(last, int):
        while len(node) <= last:
            node.append(None)
        node[last] = value
    else:
        node[last] = value


def parse_set(expressions: Iterable[str]) -> dict:
    """--set expressions as one nested mapping (later expressions win)."""
    tree: dict = {}
    for expression in expressions:
        for item in _SPLIT.split(expression):
            if not item:
                continue
            key, sep, raw = item.partition("=")
            if not sep:
                raise ImagenetTrainError(f"--set {item}: expected key=value")
            if raw.startswith("{") and raw.endswith("}"):
                value: Any = [_typed(v) for v in raw[1:-1].split(",")] if raw[1:-1] else []
            else:
                value = _typed(raw)
            _assign(tree, _path(key, item), value)
    return tree


def _field(path: Iterable[Any]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def schema_errors(values: dict, schema: dict) -> list[str]:
    """Every schema violation as 'field: what was expected', most specific first."""
    try:
        import jsonschema
    except ImportError:  # pragma: no cover
        raise ImagenetTrainError("jsonschema is missing: pip install 'imagenet-train[deploy]'") from None
    validator = jsonschema.Draft7Validator(schema)
    messages = []
    for error in sorted(validator.iter_errors(values), key=lambda e: list(e.absolute_path)):
        deepest = jsonschema.exceptions.best_match([error]) if error.context else error
        path = list(deepest.absolute_path)
        if deepest.validator == "additionalProperties":
            unknown = sorted(set(deepest.instance) - set(deepest.schema.get("properties", {})))
            path += unknown[:1]
            messages.append(f"{_field(path)}: unknown key (not in values.schema.json)")
        else:
            messages.append(f"{_field(path)}: {deepest.message}")
    return messages


def nproc(values: dict) -> int:
    """Training processes per node: nprocPerNode, else one per GPU, else 1."""
    launcher = values["launcher"]
    return int(launcher["nprocPerNode"] or max(1, launcher["gpusPerNode"]))


def rule_errors(values: dict) -> list[str]:
    """The cross-field rules of templates/_helpers.tpl "imagenet-train.validate", with its messages."""
    launcher, train, shards = values["launcher"], values["train"], values["shards"]
    errors = []
    gpus, procs = int(launcher["gpusPerNode"]), int(launcher["nprocPerNode"])
    if gpus and procs and procs != gpus:
        errors.append(
            f"launcher.nprocPerNode: {procs} processes cannot each own one of launcher.gpusPerNode={gpus} GPUs "
            "(set 0 for one per GPU)"
        )
    world = int(launcher["nodes"]) * nproc(values)
    global_batch = int(train.get("globalBatchSize") or 0)
    if global_batch and global_batch % world:
        errors.append(
            f"train.globalBatchSize: {global_batch} does not divide over {launcher['nodes']} nodes x "
            f"{nproc(values)} processes = {world} GPUs"
        )
    elastic = launcher["elastic"]
    if elastic["enabled"]:
        if launcher["kind"] == "trainjob":
            errors.append(
                "launcher.elastic.enabled: trainjob has no elastic policy; use pytorchjob, indexedjob or jobset"
            )
        elif not elastic["minNodes"] <= launcher["nodes"] <= elastic["maxNodes"]:
            errors.append(
                f"launcher.elastic: nodes={launcher['nodes']} must lie between minNodes={elastic['minNodes']} "
                f"and maxNodes={elastic['maxNodes']}"
            )
    if launcher["restartPolicy"] == "ExitCode" and launcher["kind"] != "pytorchjob":
        errors.append(
            f"launcher.restartPolicy: ExitCode is a PyTorchJob policy; {launcher['kind']} takes OnFailure or Never"
        )
    if launcher["kind"] == "trainjob" and values.get("priorityClassName"):
        errors.append("priorityClassName: trainjob cannot set it per job; set it in the training runtime")
    nginx = shards["nginx"]
    if (
        shards["server"] == "nginx"
        and int(nginx["replicas"]) > 1
        and not nginx["volume"]["existingClaim"]
        and "ReadWriteOnce" in nginx["volume"]["accessModes"]
    ):
        errors.append(
            f"shards.nginx.replicas: {nginx['replicas']} servers cannot share a ReadWriteOnce volume; "
            "use ReadOnlyMany/ReadWriteMany accessModes"
        )
    return errors


def load_values(files: Iterable[str] = (), sets: Iterable[str] = (), chart_dir: Path = CHART_DIR) -> dict:
    """Chart defaults + files + --set, validated; raises ImagenetTrainError naming the first bad field."""
    values = load_yaml(chart_dir / "values.yaml")
    for path in files:
        values = coalesce(values, load_yaml(path))
    values = coalesce(values, parse_set(sets))
    schema = json.loads((chart_dir / "values.schema.json").read_text())
    problems = schema_errors(values, schema)
    if problems:
        raise ImagenetTrainError(
            f"values: {problems[0]}" + (f" (and {len(problems) - 1} more)" if problems[1:] else "")
        )
    problems = rule_errors(values)
    if problems:
        raise ImagenetTrainError(problems[0])
    return values
