"""tools/render.py's engine: the chart's objects from the same values, with jinja2 instead of Helm.

`helpers()` is the Python twin of helm/imagenet-train/templates/_helpers.tpl (names, labels, the
training command, volumes); manifests/templates/*.yaml.j2 are the twins of the chart's templates.
tests/test_chart.py renders a matrix of values both ways and requires identical objects.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .chart_values import load_values, load_yaml, nproc
from .errors import ImagenetTrainError

TEMPLATES = Path(__file__).resolve().parents[2] / "manifests" / "templates"


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


def training_args(values: dict, shards_url: str, run_dir: str, results_url: str = "", wait_for: str = "") -> list[str]:
    """`imagenet-train launch ... -- train ...` for these values: the same on every launcher and on NGC."""
    launcher, train = values["launcher"], values["train"]
    procs = nproc(values)
    args = ["launch", "--nproc-per-node", str(procs)]
    if wait_for:
        args += ["--wait-for", wait_for, "--wait-timeout", str(launcher["waitForShardsSeconds"])]
    batch = train["globalBatchSize"] // (launcher["nodes"] * procs) if train["globalBatchSize"] else train["batchSize"]
    args += ["--", "train", "--shards", shards_url, "--arch", train["arch"], "--epochs", str(train["epochs"])]
    args += ["--batch-size", str(batch), "--workers", str(train["workers"]), "--mode", train["mode"]]
    args += ["--amp", train["amp"], "--run-dir", run_dir]
    if results_url:
        args += ["--results", results_url]
    if train["resume"]:
        args += ["--resume", train["resume"]]
    if train["checkpointEvery"]:
        args += ["--checkpoint-every", str(train["checkpointEvery"])]
    if values["cache"]["enabled"]:
        args += ["--cache-dir", "/cache"]
    return args + [str(a) for a in train["extraArgs"] or []]


def helpers(values: dict, chart: dict, release: str, namespace: str, chart_dir: Path) -> dict[str, Any]:
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
    launcher, train, shards = v["launcher"], v["train"], v["shards"]
    procs = nproc(v)
    run_name = train["runName"] or release
    if shards["server"] == "nginx":
        shards_url = f"http://{fullname}-shards/{shards['index']}"
    elif shards["server"] == "aistore":
        shards_url = f"ais://{shards['aistore']['bucket']}/{shards['index']}"
    else:
        shards_url = f"{shards['bucket']['url'].rstrip('/')}/{shards['index']}"
    ais = shards["aistore"]
    ais_endpoint = f"http://{fullname}-ais-proxy:51080" if ais["deploy"] else ais["endpoint"].rstrip("/")
    master = f"{fullname}-node-0-0.{fullname}" if launcher["kind"] == "jobset" else f"{fullname}-0.{fullname}"

    results = v["results"]["bucket"]
    args = training_args(
        v,
        shards_url,
        run_dir=f"/results/{run_name}",
        results_url=f"{results.rstrip('/')}/{run_name}" if results else "",
        wait_for=shards_url if shards["server"] != "bucket" else "",
    )

    storage_env = []
    if shards["server"] == "aistore":
        storage_env.append({"name": "AIS_ENDPOINT", "value": ais_endpoint})
    gcp = v["gcp"]
    if gcp["credentialsSecret"]:
        storage_env.append(
            {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": f"/var/run/secrets/gcp/{gcp['credentialsKey']}"}
        )
    env = list(storage_env)
    if launcher["kind"] in ("indexedjob", "jobset"):
        env += [
            {"name": "NNODES", "value": str(launcher["nodes"])},
            {"name": "MASTER_ADDR", "value": master},
            {"name": "MASTER_PORT", "value": str(launcher["port"])},
        ]
        elastic = launcher["elastic"]
        if elastic["enabled"]:
            env += [
                {"name": "PET_NNODES", "value": f"{elastic['minNodes']}:{elastic['maxNodes']}"},
                {"name": "PET_RDZV_BACKEND", "value": "c10d"},
                {"name": "PET_RDZV_ENDPOINT", "value": f"{master}:{launcher['port']}"},
                {"name": "PET_RDZV_ID", "value": fullname},
                {"name": "PET_MAX_RESTARTS", "value": str(elastic["maxRestarts"])},
            ]
    env += train["extraEnv"] or []

    resources = json.loads(json.dumps(v["resources"] or {}))
    if launcher["gpusPerNode"]:
        for part in ("limits", "requests"):
            resources[part] = {**(resources.get(part) or {}), "nvidia.com/gpu": int(launcher["gpusPerNode"])}

    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "results", "mountPath": "/results"},
    ]
    volumes: list[dict] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": str(v["shmSize"])}},
        {"name": "tmp", "emptyDir": {}},
        {
            "name": "results",
            **(
                {"persistentVolumeClaim": {"claimName": v["results"]["existingClaim"]}}
                if v["results"]["existingClaim"]
                else {"emptyDir": {}}
            ),
        },
    ]
    if v["cache"]["enabled"]:
        mounts.append({"name": "cache", "mountPath": "/cache"})
        volumes.append({"name": "cache", "emptyDir": {"sizeLimit": str(v["cache"]["sizeLimit"])}})
    if gcp["credentialsSecret"]:
        mounts.append({"name": "gcp-credentials", "mountPath": "/var/run/secrets/gcp", "readOnly": True})
        volumes.append({"name": "gcp-credentials", "secret": {"secretName": gcp["credentialsSecret"]}})

    sa = v["serviceAccount"]
    sa_name = (sa["name"] or fullname) if sa["create"] else (sa["name"] or "default")
    scheduling: dict[str, Any] = {
        "serviceAccountName": sa_name,
        "terminationGracePeriodSeconds": v["terminationGracePeriodSeconds"],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    for key in ("imagePullSecrets", "nodeSelector", "tolerations", "affinity", "priorityClassName"):
        if v[key]:
            scheduling[key] = v[key]
    return {
        "name": name,
        "fullname": fullname,
        "selectorLabels": selector,
        "labels": labels,
        "serviceAccountName": sa_name,
        "image": f"{v['image']['repository']}:{v['image']['tag'] or chart['appVersion']}",
        "nproc": procs,
        "runName": run_name,
        "shardsURL": shards_url,
        "aisEndpoint": ais_endpoint,
        "masterAddr": master,
        "args": args,
        "storageEnv": storage_env,
        "env": env,
        "resources": resources,
        "containerSecurityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
        "volumes": volumes,
        "podScheduling": scheduling,
        "queueLabel": {"kueue.x-k8s.io/queue-name": launcher["runPolicy"]["queue"]}
        if launcher["runPolicy"].get("queue")
        else {},
        "nginxConf": (Path(chart_dir) / "files" / "nginx.conf").read_text(),
        "release": {"name": release, "namespace": namespace},
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
        return yaml.safe_dump(data, default_flow_style=False, sort_keys=False, width=10_000).rstrip("\n")

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
    return env


def render(
    files: Sequence[str] = (),
    sets: Sequence[str] = (),
    release: str = "imagenet-train",
    namespace: str = "default",
    chart_dir: Path | None = None,
    templates: Path = TEMPLATES,
) -> str:
    """The YAML stream `helm template RELEASE CHART -f ... --set ...` would print (tests included)."""
    from .chart_values import CHART_DIR

    chart_dir = chart_dir or CHART_DIR
    values = _loose(load_values(files, sets, chart_dir))
    chart = load_yaml(chart_dir / "Chart.yaml")
    context = {"Values": values, "h": helpers(values, chart, release, namespace, chart_dir)}
    env = _environment(templates)
    documents = []
    for name in sorted(env.list_templates(filter_func=lambda n: n.endswith(".yaml.j2"))):
        text = env.get_template(name).render(context).strip()
        for document in text.split("\n---\n"):
            if document.strip().strip("-").strip():
                documents.append(f"# Source: {name}\n{document.strip()}\n")
    return "---\n" + "---\n".join(documents)
