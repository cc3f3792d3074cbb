"""tools/render.py's engine: the chart's objects from the same values, with jinja2 instead of Helm.

`helpers()` is the Python twin of helm/imagenet-train/templates/_helpers.tpl (names, labels, selectors,
the image); manifests/templates/*.j2 are the twins of the chart's templates, Kubernetes structure only.
tests/integration/test_chart.py renders a matrix of values both ways and requires identical objects.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from imagenet_train.deployment import admission_problems, nproc
from imagenet_train.errors import ImagenetTrainError

from . import CHART_DIR, TEMPLATES
from .values import load_values, load_yaml


class _Values(dict):
    """Values as templates see them: a key a user nulled out reads as nil, like Helm's .Values."""

    def __missing__(self, key: str) -> None:
        return None


def _loose(node: Any) -> Any:
    if isinstance(node, dict):
        return _Values({k: _loose(v) for k, v in node.items()})
    if isinstance(node, list):
        return [_loose(v) for v in node]
    return node


def _trunc(text: str, size: int) -> str:
    return text[:size].rstrip("-")


def image(values: dict, app_version: str) -> str:
    """The training image: REPOSITORY@DIGEST when a digest pins it (the tag is then ignored), else REPOSITORY:TAG."""
    if values.get("digest"):
        return f"{values['repository']}@{values['digest']}"
    return f"{values['repository']}:{values['tag'] or app_version}"


def helpers(values: dict, chart: dict, release: str, chart_dir: Path) -> dict[str, Any]:
    """Everything _helpers.tpl defines, computed once from the values."""
    v = values
    name = _trunc(v["nameOverride"] or chart["name"], 40)
    if v["fullnameOverride"]:
        fullname = _trunc(v["fullnameOverride"], 50)
    else:
        base = v["nameOverride"] or chart["name"]
        fullname = _trunc(release if base in release else f"{release}-{base}", 50)
    selector = {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": release}
    labels = {
        "helm.sh/chart": _trunc(f"{chart['name']}-{chart['version']}".replace("+", "_"), 63),
        **selector,
        "app.kubernetes.io/version": str(chart["appVersion"]),
        "app.kubernetes.io/managed-by": "Helm",
    }
    run_policy, placement = v["launcher"]["runPolicy"], v["launcher"]["placement"]
    kueue = {
        "kueue.x-k8s.io/queue-name": run_policy.get("kueueQueue"),
        "kueue.x-k8s.io/priority-class": run_policy.get("kueuePriorityClass"),
    }
    topology = {
        "kueue.x-k8s.io/podset-required-topology": placement.get("requiredTopology"),
        "kueue.x-k8s.io/podset-preferred-topology": placement.get("preferredTopology"),
    }
    sa = v["serviceAccount"]
    sa_name = (sa["name"] or fullname) if sa["create"] else (sa["name"] or "default")
    return {
        "name": name,
        "fullname": fullname,
        "selectorLabels": selector,
        "labels": labels,
        "serviceAccountName": sa_name,
        "image": image(v["image"], chart["appVersion"]),
        "kueueLabels": {key: value for key, value in kueue.items() if value},
        "topologyAnnotations": {key: value for key, value in topology.items() if value},
        "nginxConf": (Path(chart_dir) / "files" / "nginx.conf").read_text(),
        "dashboardJson": (Path(chart_dir) / "files" / "dashboard.json").read_text(),
        "nprocPerNode": nproc(v),
        "release": {"name": release},
    }


def _environment(templates: Path):
    try:
        import jinja2
    except ImportError:  # pragma: no cover - jinja2 comes with the deploy extra
        raise ImagenetTrainError("jinja2 is missing: pip install 'imagenet-train[deploy]'") from None
    import hashlib

    import yaml

    def toyaml(data: Any) -> str:
        data = json.loads(json.dumps(data))  # plain dicts for the dumper
        # Keys sorted, as Helm's toYaml writes them (it marshals through JSON).
        return yaml.safe_dump(data, default_flow_style=False, sort_keys=True, width=10_000).rstrip("\n")

    def nindent(text: str, width: int) -> str:
        pad = " " * width
        return "\n" + "\n".join(pad + line if line else line for line in str(text).split("\n"))

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["toyaml"] = toyaml
    env.filters["nindent"] = nindent
    env.filters["quote"] = lambda value: json.dumps(str(value))
    env.filters["sha256"] = lambda text: hashlib.sha256(text.encode()).hexdigest()
    env.globals["merge"] = lambda *maps: {k: v for m in maps for k, v in m.items()}
    env.globals["pick"] = lambda mapping, *keys: {k: mapping[k] for k in keys if k in mapping}
    return env


def render(
    files: Sequence[str] = (),
    release: str = "imagenet-train",
    chart_dir: Path | None = None,
    templates: Path = TEMPLATES,
) -> str:
    """The YAML stream `helm template RELEASE CHART -f ...` would print (tests included)."""
    chart_dir = chart_dir or CHART_DIR
    values = _loose(load_values(files, chart_dir))
    chart = load_yaml(chart_dir / "Chart.yaml")
    context = {"Values": values, "h": helpers(values, chart, release, chart_dir)}
    refused = admission_problems(values, context["h"]["fullname"])  # needs the release: not in load_values
    if refused:
        raise ImagenetTrainError(refused[0])
    env = _environment(templates)
    documents = []
    for name in sorted(env.list_templates(filter_func=lambda n: n.endswith(".yaml.j2"))):
        text = env.get_template(name).render(context).strip()
        for document in text.split("\n---\n"):
            if document.strip().strip("-").strip():
                documents.append(f"# Source: {name}\n{document.strip()}\n")
    return "---\n" + "---\n".join(documents)
