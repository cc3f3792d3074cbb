"""The chart tests' values matrix (every launcher x shard server x size x elastic choice) and its render.py
renders, made once per test process and shared by tests/integration/test_chart.py and
tests/integration/test_cluster_rules.py."""

from __future__ import annotations

import itertools
import tempfile
from functools import cache
from pathlib import Path

import yaml

from chartkit.objects import render

LAUNCHERS = ["pytorchjob", "indexedjob", "trainjob", "jobset"]
SERVERS = ["nginx", "aistore", "bucket"]
RELEASE = "imagenet"


def matrix_values(launcher: str, server: str, nodes: int, elastic: bool) -> dict:
    """One matrix entry; the entries also vary GPUs, fills, deploys and credentials so each path renders."""
    values: dict = {"launcher": {"kind": launcher, "nodes": nodes}, "shards": {"server": server}}
    if nodes == 1:  # CPU processes: no GPU in the limits (null deletes the default's key, as in Helm)
        values["launcher"]["nprocPerNode"] = 2
        values["resources"] = {"limits": {"nvidia.com/gpu": None}}
    if nodes == 2:
        values["train"] = {"global_batch_size": 1024, "lr": 0.4, "hflip": False}
    if elastic:
        values["launcher"]["elastic"] = {"enabled": True, "minNodes": 1, "maxNodes": max(2, nodes), "maxRestarts": 2}
    if server == "bucket":
        values["shards"]["bucket"] = {"url": "gs://acme-data/imagenet/shards"}
        values["gcp"] = {"credentialsSecret": "gcp-key"}
    if server == "aistore":
        values["shards"]["aistore"] = {"deploy": True} if nodes > 1 else {"endpoint": "http://ais-proxy.ais.svc:51080"}
    if nodes == 4:  # a queue, a priority and a topology request (preferred when elastic), exclusive for a JobSet
        values["launcher"]["runPolicy"] = {"kueueQueue": "team-a", "kueuePriorityClass": "high"}
        level = "preferredTopology" if elastic else "requiredTopology"
        values["launcher"]["placement"] = {level: "cloud.google.com/gce-topology-block"}
        if launcher == "jobset":
            values["launcher"]["placement"]["exclusiveTopology"] = "cloud.google.com/gke-nodepool"
    if nodes == 2:  # metrics on: 8 ranks per node (one per GPU) and their PodMonitor, dashboard and policy rule
        values["metrics"] = {"enabled": True}
    if nodes == 1 and server == "bucket":  # 2 CPU ranks, another first port, no dashboard
        values["metrics"] = {"enabled": True, "port": 9600, "dashboard": {"enabled": False}}
    if server == "nginx" and nodes == 4:
        values["shards"]["nginx"] = {"fill": {"enabled": True, "from": "gs://acme-data/imagenet/shards"}}
        values["results"] = {"bucket": "gs://acme-runs/imagenet"}
        values["cache"] = {"enabled": True}
    return values


MATRIX = [
    (launcher, server, nodes, elastic)
    for launcher, server, nodes, elastic in itertools.product(LAUNCHERS, SERVERS, [1, 2, 4], [False, True])
    if not (launcher == "trainjob" and elastic)  # a negative case below
]


def entry_id(entry) -> str:
    launcher, server, nodes, elastic = entry
    return f"{launcher}-{server}-{nodes}n{'-elastic' if elastic else ''}"


def parse(stream: str) -> dict[tuple[str, str], dict]:
    objects = {}
    for document in yaml.safe_load_all(stream):
        if document:
            key = (document["kind"], document["metadata"]["name"])
            assert key not in objects, f"{key} rendered twice"
            objects[key] = document
    return objects


def render_values(values: dict, release: str = RELEASE) -> dict[tuple[str, str], dict]:
    """render.py's objects for one values mapping, keyed by (kind, name)."""
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        return parse(render([str(path)], release=release))


@cache
def render_py(entry: tuple) -> dict[tuple[str, str], dict]:
    """render.py's objects for a matrix entry (cached: both test modules read the same renders)."""
    return render_values(matrix_values(*entry))
