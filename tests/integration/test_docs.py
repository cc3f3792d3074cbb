"""The docs: the MkDocs site builds in strict mode (no broken page link or anchor, no page left out of the nav),
and README.md stays a first screen that points into it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO as ROOT

README = ROOT / "README.md"
README_LIMIT = 12 * 1024


def build_site(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the theme's end-of-life banner, not a build problem
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_the_docs_site_builds_in_strict_mode(tmp_path):
    result = build_site(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}{result.stderr}"
    assert (tmp_path / "site" / "settings" / "index.html").exists()


def test_a_broken_link_in_the_docs_fails_the_strict_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [settings](settings.md#no-such-anchor) and [gone](gone.md).\n")
    (docs / "settings.md").write_text("# Settings\n")
    config = (ROOT / "mkdocs.yml").read_text()
    config = re.sub(r"\nnav:\n(?:  .*\n|\n)*", "\nnav:\n  - index.md\n  - settings.md\n", config)
    (tmp_path / "mkdocs.yml").write_text(config)
    result = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "gone.md" in output and "no-such-anchor" in output, output


@pytest.mark.unit
def test_the_readme_is_a_first_screen_with_demo_and_test_near_its_top():
    text = README.read_text()
    assert len(text.encode()) <= README_LIMIT, f"README.md is {len(text.encode())} bytes; move detail into docs/"
    top = "\n".join(text.splitlines()[:25])
    assert "make demo" in top and "make test" in top


@pytest.mark.unit
def test_the_readmes_links_into_the_docs_name_pages_that_exist():
    targets = re.findall(r"\]\((docs/[^)#\s]+)", README.read_text())
    assert targets, "README.md links to no docs page"
    missing = [target for target in targets if not (ROOT / target).is_file()]
    assert not missing, missing


@pytest.mark.unit
def test_the_generated_reports_live_in_the_docs_and_their_tools_write_there():
    for page, tool in (
        ("reliability.md", "tools/fault_table.py"),
        ("e2e.md", "tools/e2e_table.py"),
        ("benchmarks.md", "bench/benchmarks_page.py"),
    ):
        assert (ROOT / "docs" / page).is_file()
        assert f'default="docs/{page}"' in (ROOT / tool).read_text()
        assert f"--out docs/{page}" in (ROOT / "Makefile").read_text()
