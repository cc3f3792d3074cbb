#!/usr/bin/env python3
"""Regenerate what the declarations generate: the chart's values.schema.json (from the annotations in
helm/imagenet-train/values.yaml, its `train` part from app/imagenet_train/config.py), the settings table of
docs/settings.md, the chart values table of docs/chart-values.md and the commands' tables of docs/commands.md
(from each command's options dataclass). `--check` fails (exit 1) when any is stale; tests run it. Why
values.yaml is the chart's source: tools/chartkit/chart_schema.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))  # a checkout without an installed package

from chartkit.schema import generated  # noqa: E402
from imagenet_train.errors import ImagenetTrainError, one_line  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    try:
        files = generated()
    except ImagenetTrainError as error:
        print(f"generate.py: error: {one_line(str(error))}", file=sys.stderr)
        return 2
    stale = []
    for path, text in files:
        if path.read_text() != text:
            stale.append(str(path))
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run tools/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
