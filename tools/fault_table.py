"""Render the fault suite's report (JSON lines written by tests/faults) as docs/reliability.md's table.

python tools/fault_table.py .faults/report.jsonl --seconds 1234 --out docs/reliability.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HEADER = """\
# Reliability: the fault suite

Real faults against real parts, each scripted and bounded in time (pytest-timeout), on loopback or inside a
network namespace the test creates: a real nginx stopped and started again on the same port, damaged shards
served by nginx, the GCS emulator stopped with its data kept on disk, signals to the launcher and to one rank
of a 2-rank torchrun, a run directory on a small tmpfs, a slow and lossy veth link. The tests are in
`tests/faults/`; the fault injectors in `tests/faults/injectors.py`.

Every run trains the digits demo shards with resnet18 at 32 px, batch 16 per rank, 2 ranks x 2 DataLoader
workers, one epoch, a checkpoint every 4 steps (the mid-epoch moment each fault is injected at) and
`--log-keys`, with the default `--io-timeout` and `--loader-timeout` (the hung rank's run shortens them, and
`--collective-timeout`, to 20, 45 and 45 s): 4 train shards of 130 samples (520)
and 1 val shard, or for the shard-server outages 24 train shards of 20 samples (480), one worker per rank and a
10-sample shuffle buffer, so that shards are opened all through the epoch and the outage meets some.

- **Outcome**: *finished* (exit 0), *stopped cleanly* (exit 128+N after a checkpoint, or exit 2 with one
  line), then *resumed* with `--resume latest` where the fault stopped the run.
- **Lost / repeated**: training samples of the epoch never read / read more than once, from the
  `RUN_DIR/keys/train-epoch0000-rank*.txt` files (`--log-keys`) against the keys in the shards themselves
  (split and queue: every sample once; resampled: samples are drawn at random, so the figure is the epoch's
  length against its nominal length). After a SIGKILL or a full disk the position key logs
  (`RUN_DIR/position/`) stand in for the part that could not write its `--log-keys` file.
- **Broken (counted)**: samples a broken shard held past its damage (`lost_samples` in metrics.jsonl), or the
  undecodable JPEG (`corrupt_samples`): lost by design, and counted.
- **Wall time lost**: the fault's runs (both parts, with restarts) minus a clean run of the same
  configuration measured in the same session.
- **Test**: whether the test's assertions about the specified behaviour held.

The machine is shared (2 cores, load average 12-16 from other jobs while this table was made), so run times
vary by tens of seconds between identical runs: a negative "wall time lost" is that noise, or a run that
failed early.

`tc netem` is not available in this kernel (CONFIG_NET_SCH_NETEM is not set): the slow-link fault uses a
`tbf` qdisc (rate cap; its queue adds delay) on both ends of the veth pair, and random drops with iptables'
`statistic` match inside the namespace.
"""


def machine() -> str:
    """CPU model, cores, memory, kernel and the versions that matter, in one line."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = "not installed"
    return (
        f"{model or platform.processor()}, {os.cpu_count()} cores{memory}, Linux {platform.release()}, "
        f"Python {platform.python_version()}, torch {torch_version}"
    )


def revision() -> str:
    """The checkout's commit now, marked `-dirty` with uncommitted changes (the Makefile takes it at the start)."""
    try:
        command = ["git", "describe", "--always", "--dirty"]
        return subprocess.run(command, capture_output=True, text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def figure(value) -> str:
    return "–" if value is None else str(value)


def render(records: list[dict], seconds: float | None, command: str, findings: str = "", revision_id: str = "") -> str:
    """The whole docs/reliability.md for a report's records."""
    # A test run again (to measure it again) replaces its earlier row and verdict.
    rows = list({r["test"]: r for r in records if "fault" in r}.values())
    results = {r["test"]: r for r in records if "result" in r}
    lines = [HEADER]
    when = f"{seconds / 60:.1f} min" if seconds else "not measured"
    lines.append(f"Command: `{command}` (whole suite: {when}), revision {revision_id or revision()}.  ")
    lines.append(f"Machine: {machine()}.\n")
    lines.append(
        "| Fault | Mode | Outcome | Lost | Repeated | Broken (counted) | Wall time lost (s) | Run time (s) | Test |"
    )
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---|")
    for row in rows:
        result = results.get(row["test"], {}).get("result", "?")
        name = row["test"].split("::", 1)[-1]
        cells = [
            row["fault"],
            row["mode"],
            row["outcome"].replace("|", "/"),
            figure(row["lost"]),
            figure(row["repeated"]),
            figure(row.get("broken_lost")),
            figure(row["wall_lost_s"]),
            figure(row["seconds"]),
            f"{result} (`{name}`)",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    without_row = [r for test, r in results.items() if not any(row["test"] == test for row in rows)]
    if without_row:
        lines.append("\nTests that recorded no row (skipped, or failed before the fault was measured):\n")
        for result in without_row:
            lines.append(f"- `{result['test']}`: {result['result']} {result.get('reason', '')}".rstrip())
    notes = sorted({note for row in rows for note in row.get("notes", [])})
    if notes:
        lines.append("\nNotes from the runs:\n")
        lines += [f"- {note}" for note in notes]
    if findings:
        lines.append("\n" + findings.strip())
    return "\n".join(lines) + "\n"


def read_inputs(tool: str, report: str, findings: str) -> tuple[list[dict], str] | None:
    """A report's records and the findings text to append (empty without one); None, saying so, without a report."""
    path = Path(report)
    if not path.exists():
        print(f"{tool}: {path}: no report (did the run happen?)", file=sys.stderr)
        return None
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records, Path(findings).read_text() if findings and Path(findings).exists() else ""


def main(argv: list[str] | None = None) -> int:
    """Read the report, write the markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="JSON lines written by the fault suite (FAULTS_REPORT)")
    parser.add_argument("--out", default="docs/reliability.md", help="markdown file to write")
    parser.add_argument("--seconds", type=float, default=None, help="wall time of the whole suite")
    parser.add_argument("--command", default="make faults", help="the command that produced the report")
    parser.add_argument("--findings", default="", help="a markdown file appended after the table (open failures)")
    parser.add_argument("--revision", default="", help="the commit the suite ran (default: the checkout's now)")
    args = parser.parse_args(argv)
    inputs = read_inputs("fault_table", args.report, args.findings)
    if inputs is None:
        return 2
    records, findings = inputs
    Path(args.out).write_text(render(records, args.seconds, args.command, findings, args.revision))
    print(f"wrote {args.out}: {sum('fault' in r for r in records)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
