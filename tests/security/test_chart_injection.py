"""Chart values cannot add YAML structure: the schema refuses a newline in any string (helm 4, helm 3 and
tools/render.py read the same values.schema.json), and both template engines quote what they place, so a
value that got past the schema still lands as one scalar."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chartkit.objects import render

from conftest import REPO as ROOT

CHART = ROOT / "helm" / "imagenet-train"
TOOLS = ROOT / ".tools" / "bin"
HOSTILE = "x\nhostPID: true"

ATTACKS = [
    ({"schedulerName": "default-scheduler\nhostPID: true"}, "schedulerName"),
    ({"podLabels": {"team": "vision\nhostPID: true"}}, "podLabels"),
    ({"priorityClassName": "high\nhostPID: true"}, "priorityClassName"),
    ({"image": {"tag": "v1\nhostPID: true"}}, "tag"),
]
# Labels already went through toYaml; these were placed bare before the templates quoted them.
BARE = [attack for attack in ATTACKS if attack[1] != "podLabels"]
BARE.append(({"launcher": {"runPolicy": {"volcanoQueue": "q\nhostPID: true"}}}, "volcanoQueue"))


def _helm(name: str) -> str:
    path = TOOLS / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make k8s-tools`")
    return str(path)


def _helm_template(helm: str, values: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [helm, "template", "imagenet", str(CHART), "-f", str(values), "--kube-version", "1.35.0", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _render_py(values: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "render.py"), "-f", str(values)], capture_output=True, text=True
    )


def _keys(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from _keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from _keys(item)


def _scalars(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from _scalars(value)
    elif isinstance(node, list):
        for item in node:
            yield from _scalars(item)
    elif isinstance(node, str):
        yield node


def _injected(stream: str) -> tuple[bool, bool]:
    """(hostPID is a key somewhere, the hostile text survives inside one scalar)."""
    documents = [d for d in yaml.safe_load_all(stream) if d]
    as_key = any(key == "hostPID" for document in documents for key in _keys(document))
    as_text = any("\nhostPID: true" in text for document in documents for text in _scalars(document))
    return as_key, as_text


@pytest.mark.parametrize("values,field", ATTACKS, ids=[f for _, f in ATTACKS])
def test_a_newline_in_a_chart_value_is_refused_by_helm_4_helm_3_and_render_py(tmp_path, values, field):
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(values))
    for helm in (_helm("helm"), _helm("helm3")):
        result = _helm_template(helm, path)
        assert result.returncode != 0 and result.stdout == "", f"{helm} rendered {values}"
        assert field in result.stderr, f"{helm}: {result.stderr}"
    script = _render_py(path)
    assert script.returncode == 2 and script.stdout == "", script.stdout[:2000]
    assert script.stderr.startswith("render.py: error: values: ") and field in script.stderr
    assert script.stderr.count("\n") == 1


@pytest.mark.parametrize("values,field", BARE, ids=[f for _, f in BARE])
def test_with_the_schema_bypassed_the_templates_still_place_a_hostile_value_as_one_scalar(tmp_path, values, field):
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(values))
    # jinja2 twins, rendered directly against a schema that accepts anything.
    bypass = tmp_path / "chart"
    bypass.mkdir()
    for name in ("Chart.yaml", "values.yaml"):
        (bypass / name).write_text((CHART / name).read_text())
    (bypass / "files").mkdir()
    for name in ("nginx.conf", "dashboard.json"):  # the files the templates read
        (bypass / "files" / name).write_text((CHART / "files" / name).read_text())
    (bypass / "values.schema.json").write_text(json.dumps({"type": "object"}))
    stream = render([str(path)], release="imagenet", chart_dir=bypass)
    assert _injected(stream) == (False, True), f"render.py: {field} added a key"
    for helm in (_helm("helm"), _helm("helm3")):
        result = _helm_template(helm, path, "--skip-schema-validation")
        assert result.returncode == 0, f"{helm}: {result.stderr}"
        assert _injected(result.stdout) == (False, True), f"{helm}: {field} added a key"


def _string_leaves(node: Any, path: tuple = ()) -> Iterator[tuple]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _string_leaves(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _string_leaves(value, (*path, index))
    elif isinstance(node, str):
        yield path


def _set(values: dict, path: tuple, value: str) -> dict:
    out = json.loads(json.dumps(values))
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
LEAVES = list(_string_leaves(DEFAULTS))


def test_every_string_in_values_yaml_refuses_a_newline_in_the_schema():
    from chartkit.values import schema_errors

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert len(LEAVES) > 40
    accepted = []
    for path in LEAVES:
        problems = schema_errors(_set(DEFAULTS, path, HOSTILE), schema)
        if not problems:
            accepted.append(".".join(map(str, path)))
    assert accepted == [], f"the schema accepts a newline in {accepted}"


def test_helm_4_and_3_refuse_a_newline_in_every_string_of_values_yaml_at_once(tmp_path):
    """One values file with every string of values.yaml made hostile: each engine names every field."""
    hostile = DEFAULTS
    for path in LEAVES:
        hostile = _set(hostile, path, HOSTILE)
    values = tmp_path / "all.yaml"
    values.write_text(yaml.safe_dump(hostile))
    for helm in (_helm("helm"), _helm("helm3")):
        result = _helm_template(helm, values)
        assert result.returncode != 0 and result.stdout == ""
        # A key with a slash (a label key) is named as JSON Pointer writes it: app.kubernetes.io~1name.
        names = [str(p[-1] if isinstance(p[-1], str) else p[-2]) for p in LEAVES]
        missing = [
            p
            for p, name in zip(LEAVES, names, strict=True)
            if name not in result.stderr and name.replace("~", "~0").replace("/", "~1") not in result.stderr
        ]
        assert missing == [], f"{helm} did not name {missing}"


@pytest.mark.parametrize("values", [{"launcher": {"kind": "x" * 100_000}}, {"train": {"epochs": ["x" * 1000] * 100}}])
def test_a_huge_chart_value_is_echoed_clipped_in_render_pys_one_line(tmp_path, values):
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(values))
    script = _render_py(path)
    assert script.returncode == 2 and script.stdout == ""
    assert script.stderr.startswith("render.py: error: values: ") and script.stderr.count("\n") == 1
    assert len(script.stderr) < 400, script.stderr[:400]
