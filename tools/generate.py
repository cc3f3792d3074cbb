#!/usr/bin/env python3
"""Regenerate what the training settings' declarations generate: the chart schema's `train` part and the
settings table of the docs site (docs/settings.md). `--check` fails (exit 1) when either is stale; tests run it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))  # a checkout without an installed package

from chartkit.schema import SCHEMA, SETTINGS_PAGE, chart_schema_text, settings_page_text  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    stale = []
    for path, text in ((SCHEMA, chart_schema_text()), (SETTINGS_PAGE, settings_page_text())):
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
