"""Render the end-to-end run's report (JSON lines written by tests/e2e) as docs/e2e.md.

python tools/e2e_table.py .e2e/report.jsonl --seconds 1234 --load "3.1 -> 7.2" --out docs/e2e.md
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from fault_table import machine, read_inputs, revision

HEADER = """\
# End to end: the chart's pods, run

No Kubernetes API server can run on the machines these tests run on, so the harness runs what one would run.
It takes the objects `tools/render.py` renders (identical to `helm template`'s,
tests/integration/test_chart.py) and plays the rest of the cluster with podman (`tests/e2e/`):

- **kubelet** (`tests/e2e/kubelet.py`): each rendered pod spec becomes one `podman run`, field by
  field: the restricted security context (uid 10001 or 101, `--read-only` with no writable path but the
  declared volumes, `--cap-drop ALL`, no-new-privileges, the default seccomp profile, fsGroup), the volumes
  (ConfigMaps written from the rendered data and mounted read-only, emptyDirs, `/dev/shm` as a tmpfs of the
  rendered size, claims as podman volumes), memory limits, probes, the grace period, and restartPolicy (a
  container restarted in place with the kubelet's back-off). A field it does not understand fails the test.
- **controllers** (`tests/e2e/controllers.py`): Deployment, Job (Indexed, podFailurePolicy,
  backoffLimit), JobSet (child Jobs, failurePolicy), Kubeflow Training Operator v1.9 (PyTorchJob: the pods,
  Services and variables it makes, ExitCode/OnFailure, backoffLimit, cleanPodPolicy) and Kubeflow Trainer
  v2.2 (TrainJob against its torch-distributed runtime: the JobSet it makes, runtimePatches merged, PET_*).
- **cluster** (`tests/e2e/cluster.py`): a bridge network of its own, one IP per pod, DNS through
  `/etc/hosts` (headless Services, the operators' Services), ClusterIP Services forwarded to Ready pods by a
  proxy on the network's gateway; the bucket is gcp-storage-emulator on that gateway.
- **images**: the training image built by `make build` on a stand-in CUDA base (Debian + CPU torch), and a
  stand-in for `nginxinc/nginx-unprivileged`: Debian's nginx as uid 101 on port 8080 (no registry here).

Each run: 2 nodes x 1 CPU process (`launcher.nprocPerNode: 1`, `nvidia.com/gpu` removed from the limits), the
digits demo shards (1,438 train, 359 val images), resnet18 at 32 px, batch 32 per rank, 1 loader worker,
results and checkpoints to `gs://e2e/runs/RUN` on the emulator. The trainers get `STORAGE_EMULATOR_HOST` from
the chart's `env:` values; the fill pod from the harness (the chart's fill Job has no `env:`).
"""


def cell(value) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value).replace("|", "/")


def wall(value) -> str:
    return "–" if value is None else f"{value:.0f}"


def _fault_rows(faults: list[dict], verdict: Callable[[dict], str]) -> list[str]:
    """The section on pods lost mid-run: its table and what the controllers did in each run."""
    lines = ["\n## A pod lost mid-run, under the failure semantics the chart renders\n"]
    lines.append(
        "Three epochs; 5 s after rank 0 wrote epoch 0's metrics the harness SIGKILLs a pod's main process (a\n"
        "crash, an OOM kill) or evicts the pod (SIGTERM, the grace period, DisruptionTarget: a drain or a\n"
        "pre-emption), then plays the controller as the rendered objects say. A hang would fail on a timeout.\n"
    )
    heads = ["Launcher", "Fault", "Rendered semantics", "Expected", "Outcome", "Epochs", "Top-1", "Resumed"]
    lines.append("| " + " | ".join(heads) + " | Wall (s) | Test |")
    lines.append("|---|---|---|---|---|---|---:|---|---:|---|")
    for row in faults:
        cells = [row["launcher"], row["case"], row["semantics"], row["expected"], cell(row["outcome"])]
        cells += [
            cell(row["epochs"]),
            cell(row["top1"]),
            cell(row["resumed"]),
            wall(row["seconds"]),
            verdict(row),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("\nWhat the controllers did in each fault run:\n")
    for row in faults:
        lines.append(f"- {row['launcher']}, {row['case']}: " + "; ".join(e.split(" ", 1)[1] for e in row["events"]))
    return lines


def render(
    records: list[dict], seconds: float | None, load: str, command: str, findings: str = "", revision_id: str = ""
) -> str:
    """The whole docs/e2e.md for a report's records."""
    rows = list({r["test"]: r for r in records if "launcher" in r}.values())
    results = {r["test"]: r for r in records if "result" in r}
    lines = [HEADER]
    when = f"{seconds / 60:.1f} min" if seconds else "not measured"
    lines.append(
        f"Command: `{command}` (wall time {when}, load average {load or 'not measured'}), "
        f"revision {revision_id or revision()}.  "
    )
    lines.append(f"Machine: {machine()}.\n")

    def verdict(row: dict) -> str:
        return results.get(row["test"], {}).get("result", "?")

    runs = [r for r in rows if not r.get("expected")]
    lines.append("## Each launcher from each shard source\n")
    lines.append(
        "One epoch, then a new install with `epochs: 2` and `resume: latest` (a fresh results volume: the run comes\n"
        "back from the bucket). Top-1 is after the second epoch (the demo reaches 98% after 12); it is the same for\n"
        "every launcher and source because the runs are deterministic (same seed, same world of 2).\n"
    )
    lines.append("| Launcher | Shards | Result | Top-1 | In the results bucket | Resumed | Wall (s) | Test |")
    lines.append("|---|---|---|---:|---|---|---:|---|")
    for row in runs:
        cells = [row["launcher"], row["source"], f"{row['outcome']} ({row['epochs']})", cell(row["top1"])]
        cells += [cell(row["bucket"]), cell(row["resumed"]), wall(row["seconds"]), verdict(row)]
        lines.append("| " + " | ".join(cells) + " |")
    faults = [r for r in rows if r.get("expected")]
    if faults:
        lines += _fault_rows(faults, verdict)
    without_row = [r for test, r in results.items() if not any(row["test"] == test for row in rows)]
    if without_row:
        lines.append("\nOther tests:\n")
        for result in without_row:
            lines.append(f"- `{result['test']}`: {result['result']} {result.get('reason', '')}".rstrip())
    if findings:
        lines.append("\n" + findings.strip())
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Read the report, write the markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="JSON lines written by tests/e2e (E2E_REPORT)")
    parser.add_argument("--out", default="docs/e2e.md", help="markdown file to write")
    parser.add_argument("--seconds", type=float, default=None, help="wall time of the whole run")
    parser.add_argument("--load", default="", help="load average before and after, e.g. '3.1 -> 7.2'")
    parser.add_argument("--command", default="make e2e", help="the command that produced the report")
    parser.add_argument("--findings", default="", help="a markdown file appended after the tables")
    parser.add_argument("--revision", default="", help="the commit the run tested (default: the checkout's now)")
    args = parser.parse_args(argv)
    inputs = read_inputs("e2e_table", args.report, args.findings)
    if inputs is None:
        return 2
    records, findings = inputs
    Path(args.out).write_text(render(records, args.seconds, args.load, args.command, findings, args.revision))
    print(f"wrote {args.out}: {sum('launcher' in r for r in records)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
