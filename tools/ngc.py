#!/usr/bin/env python3
"""NGC batch jobs from the chart's values file: submit, follow the log, kill this project's jobs.

  tools/ngc.py submit -f my.yaml --name r50-2x8 [--dry-run]   # ngc batch run ... (array job for nodes > 1)
  tools/ngc.py tail [JOB_ID]                                  # follow the last submitted job's log
  tools/ngc.py kill [--yes]                                   # kill running jobs labelled ngc.projectLabel

Values are merged and checked exactly like `helm install -f` (the chart's values.schema.json).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))  # a checkout without an installed package

from chartkit import CHART_DIR as CHART  # noqa: E402
from chartkit import ngc_jobs as ngc  # noqa: E402
from chartkit.values import load_values, load_yaml  # noqa: E402
from imagenet_train.errors import ImagenetTrainError, one_line  # noqa: E402


def cmd_submit(args: argparse.Namespace) -> int:
    values = load_values(args.values, CHART)
    argv = ngc.run_command(values, args.name, default_tag=str(load_yaml(CHART / "Chart.yaml")["appVersion"]))
    if args.dry_run:
        print(shlex.join(argv))
        return 0
    job = ngc.submit(ngc.NGCClient(), ngc.JobState(args.state), argv)
    print(f"submitted job {job['id']} ({job['name']}); follow it with: tools/ngc.py tail {job['id']}")
    return 0


def cmd_tail(args: argparse.Namespace) -> int:
    job_id = args.job or ngc.JobState(args.state).last()["id"]
    client = ngc.NGCClient()
    client.run(ngc.tail_command(job_id, args.result_dir), capture=False)
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    values = load_values(args.values, CHART)
    label = values["ngc"]["projectLabel"]
    client = ngc.NGCClient()
    known = {str(job["id"]) for job in ngc.JobState(args.state).jobs()}
    listing = json.loads(client.run(ngc.list_command()) or "[]")
    jobs = ngc.project_jobs(listing if isinstance(listing, list) else [], label, known)
    if not jobs:
        print(f"no queued or running jobs labelled {label}")
        return 0
    for job in jobs:
        name = (job.get("jobDefinition") or {}).get("name", "")
        status = (job.get("jobStatus") or {}).get("status", "")
        print(f"{job['id']}\t{status}\t{name}")
    if not args.yes:
        answer = input(f"kill these {len(jobs)} job(s)? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing killed")
            return 1
    client.run(ngc.kill_command([str(job["id"]) for job in jobs]))
    print(f"killed {len(jobs)} job(s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state", type=Path, default=ngc.default_state_file(), help="file of submitted job ids")
    commands = parser.add_subparsers(dest="command", required=True)
    submit = commands.add_parser("submit", help="ngc batch run from a values file")
    submit.add_argument("--name", required=True, help="NGC job name")
    submit.add_argument("--dry-run", action="store_true", help="print the exact ngc command instead of running it")
    submit.set_defaults(func=cmd_submit)
    tail = commands.add_parser("tail", help="follow a job's log (default: the last one submitted)")
    tail.add_argument("job", nargs="?", help="job id")
    tail.add_argument("--result-dir", default="/results", help="the job's result mount")
    tail.set_defaults(func=cmd_tail)
    kill = commands.add_parser("kill", help="kill this project's queued and running jobs")
    kill.add_argument("--yes", "-y", action="store_true", help="do not ask")
    kill.set_defaults(func=cmd_kill)
    for command in (submit, kill):
        command.add_argument("-f", "--values", action="append", default=[], metavar="FILE", help="values file")
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ImagenetTrainError as error:
        print(f"ngc.py: error: {one_line(str(error))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
