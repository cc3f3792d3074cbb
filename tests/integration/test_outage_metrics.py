"""A real nginx goes away for a moment while a loader's worker opens its shard: the worker waits the outage out,
and the rank's /metrics reports the retries and the seconds it waited (io/outage_tally.py, training/metrics.py)."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest
import torch

from imagenet_train.loading.presets import ValPreset
from imagenet_train.loading.stream import EpochLoader, ShardStream
from imagenet_train.ops.serve import NginxServer, free_port
from imagenet_train.training.dist import DistInfo
from imagenet_train.training.metrics import RunMetrics

from conftest import labelled_jpegs, write_shard

DOWN_S = 2.0


def _up_again(server: NginxServer, loader: EpochLoader) -> None:
    """Start nginx once the worker has retried (so the outage is seen whatever the worker's start-up takes)."""
    deadline = time.monotonic() + 120
    while loader.outages()[0] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(DOWN_S)
    server.start_again(max(deadline - time.monotonic(), 1.0))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_workers_wait_for_a_stopped_nginx_shows_in_the_ranks_metrics_as_retries_and_seconds(tmp_path):
    write_shard(tmp_path / "a.tar", labelled_jpegs([b"1"] * 8, key="s{}"))
    server = NginxServer(str(tmp_path), port=free_port())
    server.start()
    server.stop()  # gone when the worker first asks for the shard
    stream = ShardStream(urls=[f"{server.url}/a.tar"], transform=ValPreset(16).build(), batch_size=4, resampled=False)
    loader = EpochLoader(stream, workers=1)
    returning = threading.Thread(target=_up_again, args=(server, loader))
    info = DistInfo(rank=0, world=1, local_rank=0, device=torch.device("cpu"))
    port = free_port()
    metrics = RunMetrics.serve(port, info, host="127.0.0.1")
    metrics.count_outages([loader])
    try:
        returning.start()
        batches = list(loader)
    finally:
        returning.join()
        loader.close()
        server.stop()
    assert sum(len(labels) for _, labels, _ in batches) == 8  # every sample, after the outage
    retries, seconds = loader.outages()
    assert retries >= 1
    assert DOWN_S <= seconds < DOWN_S + 60  # from the first failed open to the retry that found nginx back
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    labels = '{node="' + metrics.labels[1] + '",rank="0"}'
    assert f"imagenet_train_io_retries_total{labels} {float(retries)}" in text, text
    assert f"imagenet_train_io_outage_seconds_total{labels} {seconds!r}" in text, text
