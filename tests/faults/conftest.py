"""Fixtures of the fault suite: small shard sets, the report the table is made from, clean baselines."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import reports

from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.ops.serve import NginxServer

from .injectors import subset_shards
from .runs import Row, run_to_end


@pytest.fixture(scope="session")
def four_shards(digit_shards, tmp_path_factory) -> Path:
    """4 train shards (520 samples, one per DataLoader worker of 2 ranks x 2 workers) and 1 val shard."""
    return subset_shards(digit_shards, tmp_path_factory.mktemp("four-shards"), train=4, val=1)


@pytest.fixture(scope="session")
def many_shards(digits_dir, tmp_path_factory) -> Path:
    """24 train shards of 20 samples (480) and 1 val shard: with a small shuffle buffer every worker opens a
    new shard every batch or two, so an outage at any moment of the epoch meets a shard open."""
    every = tmp_path_factory.mktemp("twenty-per-shard")
    convert(str(digits_dir), str(every), ShardOptions(maxcount=20), progress=False)
    return subset_shards(every, tmp_path_factory.mktemp("many-shards"), train=24, val=1)


def report_path(base: Path) -> Path:
    """FAULTS_REPORT, or faults.jsonl in pytest's base temp directory."""
    return Path(os.environ.get("FAULTS_REPORT") or base / "faults.jsonl")


@pytest.fixture
def record(request, tmp_path_factory) -> Callable[[Row], None]:
    """Append this test's row(s) to the fault report (JSON lines), stamped with the test's id."""
    return reports.recorder(report_path(tmp_path_factory.getbasetemp()), request.node.nodeid)


class Baselines:
    """Wall time of a clean run of a configuration, measured once per session (only when a report is made:
    FAULTS_REPORT set, as `make faults` does; `make test` skips the extra runs and records no figure)."""

    def __init__(self, base: Path):
        self.base, self.seconds = base, {}
        self.enabled = bool(os.environ.get("FAULTS_REPORT"))
        # Kept beside the report, so a test run again on its own compares with the same clean runs.
        self.saved = report_path(base).with_suffix(".baselines.json") if self.enabled else None
        if self.saved and self.saved.exists():
            self.seconds = json.loads(self.saved.read_text())

    def of(self, name: str, measure: Callable[[Path], float]) -> float | None:
        """Seconds of the clean run called `name`; `measure(workdir)` runs it once and returns its wall time."""
        if not self.enabled:
            return None
        if name not in self.seconds:
            workdir = self.base / f"baseline-{len(self.seconds)}"
            workdir.mkdir(parents=True)
            self.seconds[name] = measure(workdir)
            if self.saved:
                self.saved.write_text(json.dumps(self.seconds, indent=1))
        return self.seconds[name]

    def over_nginx(self, name: str, shards: Path, args: list[str], timeout: float = 400) -> float | None:
        """Baseline of `args` (without --shards/--run-dir) trained from a fresh nginx serving `shards`."""

        def measure(workdir: Path) -> float:
            with NginxServer(str(shards)) as server:
                run = run_to_end(
                    ["--shards", f"{server.url}/shards.json", "--run-dir", str(workdir / "run"), *args],
                    workdir / "baseline.log",
                    timeout,
                )
            assert run.process.returncode == 0, f"baseline {name} failed:\n{run.output()[-3000:]}"
            return run.seconds

        return self.of(name, measure)


@pytest.fixture(scope="session")
def baselines(tmp_path_factory) -> Baselines:
    return Baselines(tmp_path_factory.mktemp("baselines"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Record each fault test's verdict in the report beside its row, so the table says whether it held."""
    report = yield
    reports.record_verdict(report_path(item.config._tmp_path_factory.getbasetemp()), item.nodeid, report)
    return report
