"""No function or method in app/ or tools/ runs past 60 lines (issue 36): read from the source with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

LIMIT = 60  # lines from the `def` line to the function's last line (decorators not counted)


def long_functions(root: Path, limit: int = LIMIT) -> list[str]:
    """`path:line name (N lines)` for every function under `root` longer than `limit` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path}:{node.lineno} {node.name} ({length} lines)")
    return found


@pytest.mark.parametrize("folder", ["app", "tools"])
def test_no_function_is_longer_than_sixty_lines(folder):
    assert long_functions(REPO / folder) == []


def test_a_function_of_sixty_one_lines_is_reported(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n\ndef short():\n    return 1\n")
    found = long_functions(tmp_path)
    assert len(found) == 1 and found[0].endswith("long.py:1 long (61 lines)")
