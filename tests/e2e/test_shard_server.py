"""The chart's shard server for real, in `make test` (about a minute once the image exists): the nginx
Deployment on the stand-in image under the chart's restricted security context, filled by the fill Job from
the bucket, read by the chart's `helm test` pod through the Service. The training runs are in test_pods.py."""

from __future__ import annotations

import json
from pathlib import Path

from .runs import values


def test_helm_test_pod_reads_the_filled_shard_server(releases, emulator):
    code, log = releases["nginx"].helm_test(values("indexedjob", "nginx", "install", emulator, epochs=1))
    assert code == 0, log
    assert "1438 train samples in 12 shards" in log


def test_the_shard_server_and_the_fill_ran_under_the_restricted_security_context(releases, cluster):
    server = next(iter(releases["nginx"].server.pods.values()))
    fields = (
        "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}} {{json .HostConfig.CapDrop}} {{json .HostConfig.SecurityOpt}}"
    )
    user, read_only, dropped, options = cluster.engine("inspect", server.container, "--format", fields).stdout.split()
    assert (user, read_only) == ("101:101", "true")
    assert "CAP_NET_BIND_SERVICE" in json.loads(dropped) and "no-new-privileges" in json.loads(options)
    volume = cluster.engine(
        "volume", "inspect", cluster.claim("ngx-imagenet-train-shards"), "--format", "{{.Mountpoint}}"
    )
    index = Path(volume.stdout.strip()) / "shards.json"
    assert (index.stat().st_uid, index.stat().st_gid) == (10001, 10001)  # written by the fill pod's user, fsGroup
