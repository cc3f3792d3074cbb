"""A rank that finds another gone leaves to be retried (errors.RETRY_EXIT), and only then: the classification
is checked against the error a real gloo world raises when a peer process dies, and against errors of this
rank's own making. The whole path (a lost node, the other exiting 138, a new world resuming) is in
tests/faults/test_preemption.py; the launchers' reaction to 138 in tests/e2e."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

from imagenet_train.training.dist import is_peer_lost, peer_lost_reason

# Rank 1 joins and dies without a word; rank 0's next collective fails, and it reports how it classified that.
WORLD = textwrap.dedent(
    """
    import datetime, json, os, sys
    import torch, torch.distributed as dist
    from imagenet_train.training.dist import is_peer_lost, peer_lost_reason
    rank = int(sys.argv[1])
    store = dist.FileStore(sys.argv[2], 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    dist.barrier()
    if rank == 1:
        os._exit(137)
    import time; time.sleep(1)
    try:
        dist.all_reduce(torch.ones(1000))
    except Exception as error:
        report = {"type": type(error).__name__, "lost": is_peer_lost(error), "reason": peer_lost_reason(error)}
        print(json.dumps(report))
    """
)


def test_the_error_of_a_gloo_world_whose_peer_died_is_a_lost_peer(tmp_path):
    store = tmp_path / "store"
    ranks = [
        subprocess.Popen([sys.executable, "-c", WORLD, str(rank), str(store)], stdout=subprocess.PIPE, text=True)
        for rank in (0, 1)
    ]
    out, _ = ranks[0].communicate(timeout=120)
    ranks[1].wait(timeout=30)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["lost"], report
    assert "peer" in report["reason"] and "gloo" not in report["reason"], report  # the reason, not the source file


@pytest.mark.unit
@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (dist.DistNetworkError("Connection reset by peer"), True),
        (dist.DistBackendError("NCCL communicator was aborted"), True),
        (dist.DistStoreError("Timed out after 600 seconds waiting for clients"), True),
        (torch.OutOfMemoryError("CUDA out of memory"), False),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (ValueError("[/x/gloo/transport/tcp/pair.cc:1] not a RuntimeError"), False),
    ],
)
def test_only_errors_of_a_broken_world_count_as_a_lost_peer(error, lost):
    assert is_peer_lost(error) is lost


@pytest.mark.unit
def test_the_reason_drops_gloos_source_location_and_advice():
    error = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.7]:33706: "
        "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application."
    )
    assert is_peer_lost(error)
    assert peer_lost_reason(error) == "Read error [10.0.0.7]:33706: Connection reset by peer"
