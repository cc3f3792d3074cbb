"""The chart's one source: values.yaml's `# --`, `# @schema` and `# @rule` lines generate values.schema.json
and docs/chart-values.md; a stale file, an unknown kind or a rule naming a missing key fails generation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from chartkit import schema
from chartkit.values import schema_errors
from imagenet_train.errors import ImagenetTrainError

from conftest import REPO as ROOT

VALUES = ROOT / "helm" / "imagenet-train" / "values.yaml"


def _edited(tmp_path: Path, old: str, new: str) -> Path:
    text = VALUES.read_text()
    assert text.count(old) == 1, old
    path = tmp_path / "values.yaml"
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.unit
def test_generate_check_passes_on_the_committed_files():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.unit
def test_a_changed_annotation_makes_the_committed_schema_and_values_page_stale(tmp_path):
    edited = _edited(tmp_path, "# @schema 1..1024 required\n  nodes: 2", "# @schema 1..512 required\n  nodes: 2")
    assert schema.chart_schema_text(edited) != schema.SCHEMA.read_text()
    assert schema.values_page_text(edited) != schema.VALUES_PAGE.read_text()
    launcher = json.loads(schema.chart_schema_text(edited))["properties"]["launcher"]
    assert launcher["properties"]["nodes"] == {
        "description": "Nodes (pods) in the job; with elastic.enabled the number it starts with.",
        "type": "integer",
        "minimum": 1,
        "maximum": 512,
    }
    assert "| `launcher.nodes` | `2` | whole number, 1 to 512 |" in schema.values_page_text(edited)


@pytest.mark.unit
def test_generate_check_names_every_stale_file_and_generate_rewrites_them(tmp_path, monkeypatch):
    stale_schema, stale_page = tmp_path / "values.schema.json", tmp_path / "chart-values.md"
    stale_schema.write_text(schema.SCHEMA.read_text().replace('"maximum": 1024', '"maximum": 1025'))
    stale_page.write_text(schema.VALUES_PAGE.read_text().replace("`launcher.nodes`", "`launcher.nodez`"))
    monkeypatch.setattr(schema, "SCHEMA", stale_schema)
    monkeypatch.setattr(schema, "VALUES_PAGE", stale_page)
    import generate

    monkeypatch.setattr(generate, "generated", schema.generated)
    assert generate.main(["--check"]) == 1
    assert "1025" in stale_schema.read_text()  # --check writes nothing
    assert generate.main([]) == 0 and generate.main(["--check"]) == 0
    assert stale_schema.read_text() == (ROOT / "helm/imagenet-train/values.schema.json").read_text()


@pytest.mark.unit
def test_every_value_key_has_a_schema_and_every_string_refuses_control_characters():
    generated = json.loads(schema.chart_schema_text())

    def strings(node, path=""):
        if isinstance(node, dict):
            if node.get("type") == "string" or "string" in (node.get("type") or []):
                yield path, node
            for key, value in node.items():
                if key not in ("if", "then", "not"):
                    yield from strings(value, f"{path}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                yield from strings(value, f"{path}[{index}]")

    loose = [path for path, node in strings(generated) if not ({"pattern", "enum", "maxLength"} & set(node))]
    assert loose == []
    patterns = {node["pattern"] for _, node in strings(generated) if "pattern" in node}
    assert all(p.startswith("^") and p.endswith("$") for p in patterns)


@pytest.mark.unit
def test_the_rules_in_values_yaml_reach_the_schema():
    generated = json.loads(schema.chart_schema_text())
    defaults = yaml.safe_load(VALUES.read_text())
    comments = [rule["$comment"] for rule in generated["allOf"]]
    assert comments[0] == "trainjob has no elastic policy: use pytorchjob, indexedjob or jobset"
    bad = {**defaults, "launcher": {**defaults["launcher"], "kind": "trainjob"}, "hostNetwork": True}
    assert [m for m in schema_errors(bad, generated) if m.startswith("hostNetwork:")], schema_errors(bad, generated)
    aistore = {**defaults, "shards": {**defaults["shards"], "server": "aistore"}}
    del aistore["shards"]["aistore"]["deploy"]  # a dropped `deploy` is not a deployed AIStore: it needs an endpoint
    assert any("endpoint" in message for message in schema_errors(aistore, generated))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "# @schema 1..1024 required\n  nodes",
            "# @schema dns-lable\n  nodes",
            "launcher.nodes: @schema: unknown kind 'dns-lable'",
        ),
        ("# @schema [capability]\n", "# @schema [capability\n", "addCapabilities: @schema: expected ]"),
        ("# @schema [capability]\n", "# @schema\n", "addCapabilities: needs a `# @schema` line"),
        (
            "then launcher.elastic.enabled = false",
            "then launcher.elastic.on = false",
            "@rule: no key 'launcher.elastic.on'",
        ),
        ("if server = bucket then", "if server = bucket so", "@rule: expected 'if CONDITION then RULE'"),
        ("    # @schema.emptyDir {}\n", "    # @scheme.emptyDir {}\n", "unknown annotation '@scheme.emptyDir'"),
    ],
    ids=["unknown-kind", "unclosed-list", "empty-list-without-spec", "rule-missing-key", "rule-no-then", "typo"],
)
def test_a_bad_annotation_is_one_error_naming_the_line_and_key(tmp_path, old, new, message):
    edited = _edited(tmp_path, old, new)
    with pytest.raises(ImagenetTrainError, match=r"^values\.yaml:\d+: ") as caught:
        schema.chart_schema_text(edited)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"shards": {"nginx": {"fill": {"enabled": True, "from": "s3://acme/shards"}}}},
            "shards.nginx.fill.from: expected gs://BUCKET[/PREFIX] or empty, got 's3://acme/shards'",
        ),
        (
            {"launcher": {"kind": "trainjob", "elastic": {"enabled": True}}},
            "launcher.elastic.enabled: expected launcher.elastic.enabled = false when launcher.kind = trainjob "
            "(trainjob has no elastic policy: use pytorchjob, indexedjob or jobset)",
        ),
        (
            {"shards": {"nginx": {"fill": {"enabled": True}}}},
            "shards.nginx.fill.from: expected from is set when enabled = true (a fill needs its source)",
        ),
        ({"image": {"digest": "v0.1"}}, "image.digest: expected image digest (sha256:64 hex digits) or empty"),
        ({"resources": {"limits": {"memory": "lots"}}}, "resources.limits.memory: expected Kubernetes quantity"),
    ],
    ids=["format-or-empty", "rule", "rule-is-set", "pattern", "quantity"],
)
def test_schema_errors_say_what_was_expected_and_which_rule_asks_it_once_per_field(changes, message):
    from chartkit.values import coalesce

    values = coalesce(yaml.safe_load(VALUES.read_text()), changes)
    problems = schema_errors(values, json.loads(schema.SCHEMA.read_text()))
    assert len(problems) == 1 and problems[0].startswith(message), problems
