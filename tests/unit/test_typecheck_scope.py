"""Every module of app/ and tools/ is type-checked at the one strictness pyproject.toml's [tool.mypy] states (issue
49): no module is exempt, and each `type: ignore` names its error code and says which stub or checker gap it covers.
`make typecheck` runs mypy itself; these read the configuration and the source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

IGNORE = re.compile(r"#\s*type:\s*ignore(?P<code>\[[a-z0-9-]+(?:,\s*[a-z0-9-]+)*\])?(?P<rest>.*)$")


def exempt_modules(pyproject: str) -> list[str]:
    """The [[tool.mypy.overrides]] blocks that switch errors off (`ignore_errors = true`), by their first line."""
    blocks = pyproject.split("[[tool.mypy.overrides]]")[1:]
    return [block.strip().splitlines()[0] for block in blocks if re.search(r"(?m)^ignore_errors\s*=\s*true", block)]


def unexplained_ignores(root: Path) -> list[str]:
    """`path:line` for each `type: ignore` under `root` without an error code, or without a reason in a comment
    after it or on the line above."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            match = IGNORE.search(line)
            if not match:
                continue
            above = lines[number - 2].strip() if number > 1 else ""
            reason = match["rest"].strip().startswith("#") or above.startswith("#")
            if not match["code"] or not reason:
                found.append(f"{path.relative_to(root)}:{number}")
    return found


def test_no_module_is_exempt_from_the_type_checker():
    assert exempt_modules((REPO / "pyproject.toml").read_text()) == []


def test_an_override_that_switches_errors_off_is_found():
    text = '[tool.mypy]\n\n[[tool.mypy.overrides]]\nmodule = ["a.b"]\nignore_errors = true\n'
    assert exempt_modules(text) == ['module = ["a.b"]']


@pytest.mark.parametrize("folder", ["app", "tools"])
def test_every_type_ignore_names_its_error_code_and_why(folder):
    assert unexplained_ignores(REPO / folder) == []


def test_a_bare_or_unexplained_ignore_is_reported(tmp_path):
    (tmp_path / "m.py").write_text(
        "a = 1  # type: ignore\n"
        "b = 2  # type: ignore[attr-defined]\n"
        "c = 3  # type: ignore[attr-defined]  # the stubs lack c\n"
        "# the stubs lack d\n"
        "d = 4  # type: ignore[arg-type]\n"
    )
    assert unexplained_ignores(tmp_path) == ["m.py:1", "m.py:2"]
