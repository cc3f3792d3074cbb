#!/usr/bin/env python3
"""Render the chart's Kubernetes objects without Helm: `tools/render.py -f my.yaml | kubectl apply -f -`.

Same values (chart defaults, then each -f in order, then --set), same schema, same objects as
`helm template RELEASE helm/imagenet-train`; templates live in manifests/templates/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))  # runs from a checkout without installing the package

from imagenet_train.errors import ImagenetTrainError, one_line  # noqa: E402
from imagenet_train.manifests import render  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-f", "--values", action="append", default=[], metavar="FILE", help="values file (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="like helm --set (repeatable)")
    parser.add_argument("--release", default="imagenet-train", help="release name (object name prefix)")
    parser.add_argument("--namespace", "-n", default="default", help="namespace shown in notes")
    args = parser.parse_args(argv)
    try:
        stream = render(
            args.values,
            args.set,
            release=args.release,
            namespace=args.namespace,
            chart_dir=ROOT / "helm" / "imagenet-train",
            templates=ROOT / "manifests" / "templates",
        )
    except ImagenetTrainError as error:
        print(f"render.py: error: {one_line(str(error))}", file=sys.stderr)
        return 2
    sys.stdout.write(stream)
    return 0


if __name__ == "__main__":
    sys.exit(main())
