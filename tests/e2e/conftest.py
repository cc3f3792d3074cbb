"""The end-to-end run of the chart's pods: no Kubernetes API server can run here, so the harness runs what it
would run. The chart's objects (tools/render.py, identical to `helm template`) go to a one-node cluster made of
podman: kubelet.py runs each rendered pod spec as `podman run` (refusing any field it does not understand),
controllers.py plays the Deployment, Job, JobSet, PyTorchJob and TrainJob controllers (the pods they make, the
variables they inject, the failure semantics the objects render), cluster.py gives pods IPs, DNS and Services,
release.py is Helm. The bucket is gcp-storage-emulator, started here on the cluster network's gateway.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import imagebuild
import pytest
import reports

from .cluster import Cluster, sweep_abandoned
from .release import Release
from .runs import BUCKET, SHARDS, Row, report_path, values
from conftest import gcs_emulator


@pytest.fixture(scope="session")
def cluster(training_image, tmp_path_factory):
    """The podman cluster with the training image and the stand-in nginx image."""
    tmp = tmp_path_factory.mktemp("cluster")
    imagebuild.nginx_standin(training_image.engine, tmp)
    left = sweep_abandoned(training_image.engine)
    if left:
        warnings.warn(f"removed what aborted e2e sessions left: {', '.join(left)}", stacklevel=1)
    built = Cluster(training_image.engine, tmp)
    yield built
    built.close()


@pytest.fixture(scope="session")
def emulator(cluster, digit_shards) -> str:
    """gcp-storage-emulator on the cluster's gateway (the pods' way to the host), the digit shards uploaded to
    gs://e2e/shards; STORAGE_EMULATOR_HOST points this process at it too."""
    with gcs_emulator(BUCKET, cluster.gateway) as host:
        upload = [str(Path(sys.executable).with_name("imagenet-train")), "upload", "--workers", "4"]
        result = subprocess.run([*upload, str(digit_shards), SHARDS], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        yield host


@pytest.fixture(scope="session")
def releases(cluster, emulator, tmp_path_factory):
    """Release `ngx`: the nginx shard server Ready, its volume filled from the bucket by the fill Job (which
    gets STORAGE_EMULATOR_HOST from the harness: the chart's fill Job takes no `env:`). Release `bkt`: the
    trainers stream the shards from the bucket."""
    fill_env = [{"name": "STORAGE_EMULATOR_HOST", "value": emulator}]
    made = {
        "nginx": Release(cluster, "ngx", tmp_path_factory.mktemp("ngx"), fill_env=fill_env),
        "bucket": Release(cluster, "bkt", tmp_path_factory.mktemp("bkt")),
    }
    for source, release in made.items():
        outcome = release.install(values("indexedjob", source, "install", emulator, epochs=1))
        assert outcome.state == "Succeeded", (outcome.reason, outcome.events)
    yield made
    for release in made.values():
        release.uninstall()


@pytest.fixture
def record(request, tmp_path_factory) -> Callable[[Row], None]:
    """Append this test's row(s) to the e2e report (JSON lines) that tools/e2e_table.py makes docs/e2e.md from."""
    return reports.recorder(report_path(tmp_path_factory.getbasetemp()), request.node.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's verdict goes into the report beside its row, so the table says whether it held."""
    report = yield
    reports.record_verdict(report_path(item.config._tmp_path_factory.getbasetemp()), item.nodeid, report)
    return report
