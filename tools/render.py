#!/usr/bin/env python3
"""Render the chart's Kubernetes objects without Helm: `tools/render.py -f my.yaml | kubectl apply -f -`.

Same values (chart defaults, then each -f in order), same schema and rules, same objects as
`helm template RELEASE helm/imagenet-train -f my.yaml`; templates live in manifests/templates/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))  # a checkout without an installed package

from chartkit.objects import render  # noqa: E402
from imagenet_train.errors import ImagenetTrainError, one_line  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-f", "--values", action="append", default=[], metavar="FILE", help="values file (repeatable)")
    parser.add_argument("--release", default="imagenet-train", help="release name (object name prefix)")
    args = parser.parse_args(argv)
    try:
        stream = render(args.values, release=args.release)
    except ImagenetTrainError as error:
        print(f"render.py: error: {one_line(str(error))}", file=sys.stderr)
        return 2
    sys.stdout.write(stream)
    return 0


if __name__ == "__main__":
    sys.exit(main())
