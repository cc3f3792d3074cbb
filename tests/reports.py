"""The JSON-lines reports `make faults` and `make e2e` make their tables from (tools/fault_table.py,
tools/e2e_table.py): the rows a test records, and each test's verdict beside them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as stream:
        stream.write(line + "\n")


def recorder(path: Path, test_id: str) -> Callable[[Any], None]:
    """What a test calls with each of its rows (dataclasses with `test` and `as_json()`), stamped with its id."""

    def record(row: Any) -> None:
        row.test = test_id
        append(path, row.as_json())

    return record


def record_verdict(path: Path, test_id: str, report) -> None:
    """A test's outcome once it is known (its call, or a setup that did not pass), with the reason when it
    failed or was skipped."""
    if not (report.when == "call" or (report.when == "setup" and report.outcome != "passed")):
        return
    verdict = {"test": test_id, "result": report.outcome}
    if report.failed:
        verdict["reason"] = str(report.longrepr).strip().splitlines()[-1][:300]
    elif report.skipped and isinstance(report.longrepr, tuple):
        verdict["reason"] = report.longrepr[2]
    append(path, json.dumps(verdict))
