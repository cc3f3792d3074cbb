"""Chart.yaml's Artifact Hub annotations parse as Artifact Hub reads them and agree with the chart, its values
and its CHANGELOG (artifacthub.io/docs/topics/annotations/helm)."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import REPO

pytestmark = pytest.mark.unit

CHART = REPO / "helm" / "imagenet-train"
CHANGE_KINDS = {"added", "changed", "deprecated", "removed", "fixed", "security"}
CATEGORIES = {"ai-machine-learning", "database", "integration-delivery", "monitoring-logging", "networking"}
CATEGORIES |= {"security", "storage", "streaming-messaging"}


def chart() -> dict:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def annotation(name: str):
    """An artifacthub.io annotation, parsed when it holds YAML (Artifact Hub's list and mapping annotations do)."""
    return yaml.safe_load(chart()["annotations"][f"artifacthub.io/{name}"])


def test_changelog_newest_version_is_chart_yaml_version_and_versions_go_down():
    versions = re.findall(r"^## (\d+\.\d+\.\d+)$", (CHART / "CHANGELOG.md").read_text(), flags=re.MULTILINE)
    assert versions[0] == chart()["version"]
    assert [tuple(map(int, v.split("."))) for v in versions] == sorted(
        (tuple(map(int, v.split("."))) for v in versions), reverse=True
    )


def test_artifact_hub_changes_are_a_list_of_known_kinds_with_descriptions():
    changes = annotation("changes")
    assert changes and all(set(change) <= {"kind", "description", "links"} for change in changes)
    assert all(change["kind"] in CHANGE_KINDS and change["description"].strip() for change in changes)


def test_artifact_hub_license_category_and_links_are_valid():
    license_line = re.search(r'^license = \{ text = "([^"]+)" \}$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert license_line and annotation("license") == license_line.group(1)
    assert annotation("category") in CATEGORIES
    links = annotation("links")
    assert links and all(set(link) == {"name", "url"} and link["url"].startswith("https://") for link in links)


def test_artifact_hub_images_are_the_images_the_default_values_run():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    nginx = values["shards"]["nginx"]["image"]
    expected = {
        f"{values['image']['repository']}:{chart()['appVersion']}",
        f"{nginx['repository']}:{nginx['tag']}",
    }
    assert {image["image"] for image in annotation("images")} == expected


def test_artifact_hub_sign_key_names_a_fingerprint_and_where_the_public_key_is():
    sign_key = annotation("signKey")
    assert set(sign_key) == {"fingerprint", "url"}
    assert re.fullmatch(r"[0-9A-F]{40}", sign_key["fingerprint"])
    assert sign_key["url"].startswith("https://")
