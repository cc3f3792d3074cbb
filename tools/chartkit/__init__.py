"""Operator tools over the chart: values (merge and schema), jinja2 rendering, NGC batch and the generated
schema and flag reference. Not part of the training image: the pods import only `imagenet_train`."""

from pathlib import Path

# tools/ lives in a checkout beside helm/ and manifests/; these tools never run from an installed package.
ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "imagenet-train"
TEMPLATES = ROOT / "manifests" / "templates"
