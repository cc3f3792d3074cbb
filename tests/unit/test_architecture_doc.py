"""docs/architecture.md drawn from the code: every module of the package named in its table, and the listing of
which package imports which equal to what its own command prints today."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

DOC = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "app" / "imagenet_train"


def documented_listing() -> str:
    """The lines under "At the time of writing it prints:"."""
    text = DOC.read_text()
    found = re.search(r"At the time of writing it prints:\n\n```\n(.*?)```", text, re.S)
    assert found, f"{DOC}: no printed listing"
    return found.group(1)


def documented_command() -> str:
    """The bash block that prints which package imports which (the first block with `for d in`)."""
    found = re.search(r"```bash\n(cd app/imagenet_train\nfor d in .*?)```", DOC.read_text(), re.S)
    assert found, f"{DOC}: no command that prints the listing"
    return found.group(1)


def test_every_module_of_the_package_is_named_in_the_architecture_page():
    text = DOC.read_text()
    missing = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "__init__.py" and f"`{path.name}`" not in text and f"`{path.relative_to(PACKAGE)}`" not in text
    ]
    assert not missing, f"{DOC.name} names no {', '.join(missing)}"


def test_the_printed_package_imports_are_what_the_pages_command_prints_today():
    printed = subprocess.run(
        ["bash", "-c", documented_command()], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    normalise = lambda text: [line.rstrip() for line in text.strip().splitlines()]  # noqa: E731
    assert normalise(printed) == normalise(documented_listing())
