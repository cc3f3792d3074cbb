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


def exempt_modules(pyproject: str, ours: set[str]) -> list[str]:
    """The project's modules (`ours`: top-level names) that a [[tool.mypy.overrides]] block names: whatever it
    switches, it holds them to another strictness than the one stated (third-party overrides, DALI's, are fine)."""
    named = []
    for block in pyproject.split("[[tool.mypy.overrides]]")[1:]:
        listed = re.search(r"(?ms)^module\s*=\s*(\[.*?\]|\"[^\"]*\")", block)
        for module in re.findall(r'"([^"]+)"', listed[1] if listed else ""):
            if module.split(".")[0] in ours:
                named.append(module)
    return named


def inline_switches(root: Path) -> list[str]:
    """`path:line` of each `# mypy:` comment under `root`, a per-file change of the strictness."""
    return [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"\s*#\s*mypy:", line)
    ]


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


def _ours() -> set[str]:
    return {"imagenet_train", *(path.stem for path in (REPO / "tools").glob("*.py"))}


def test_no_module_is_exempt_from_the_type_checker():
    assert exempt_modules((REPO / "pyproject.toml").read_text(), _ours()) == []
    assert inline_switches(REPO / "app") + inline_switches(REPO / "tools") == []


def test_an_override_or_a_file_comment_that_exempts_one_of_ours_is_found(tmp_path):
    text = (
        '[tool.mypy]\n\n[[tool.mypy.overrides]]\nmodule = ["nvidia.dali", "imagenet_train.io.gcs"]\n'
        'disable_error_code = ["arg-type"]\n\n[[tool.mypy.overrides]]\nmodule = "k8s_tools"\nignore_errors = true\n'
    )
    assert exempt_modules(text, {"imagenet_train", "k8s_tools"}) == ["imagenet_train.io.gcs", "k8s_tools"]
    (tmp_path / "m.py").write_text("# mypy: ignore-errors\nx = 1\n")
    assert inline_switches(tmp_path) == ["m.py:1"]


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
