"""A real gloo world in which one rank stops (SIGSTOP) after the rendezvous: the other's collective fails once the
process group's timeout has passed (not the old fixed 30 minutes), the failure is classified as a collective
timeout, and the heartbeats in the job's store name the rank that stopped. The whole run under torchrun, with the
CLI's one line and exit code: tests/faults/test_hung_rank.py (make faults)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from imagenet_train.ops.serve import free_port

TIMEOUT_S = 3

WORLD = textwrap.dedent(
    """
    import datetime, json, os, signal, sys, time
    import torch, torch.distributed as dist
    from imagenet_train.training.dist import is_collective_timeout
    from imagenet_train.training.liveness import Heartbeat
    rank, port, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=timeout))
    beat = Heartbeat(rank, 2, timeout).start()
    dist.barrier()
    time.sleep(1)  # a few beats each
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1000))
    except Exception as error:
        waited = time.monotonic() - started
        line = beat.who_stopped(138, timeout)
        print(json.dumps({"timeout": is_collective_timeout(error), "waited": waited, "line": line}), flush=True)
    """
)


def test_a_stopped_rank_ends_the_others_collective_at_the_timeout_and_its_heartbeat_names_it(tmp_path):
    port = str(free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", WORLD, str(rank), port, str(TIMEOUT_S)], stdout=subprocess.PIPE, text=True, env=env
        )
        for rank in (0, 1)
    ]
    try:
        started = time.monotonic()
        out, _ = ranks[0].communicate(timeout=120)
        took = time.monotonic() - started
    finally:
        ranks[1].send_signal(signal.SIGKILL)
        ranks[1].wait(timeout=30)
        ranks[0].kill()
    report = json.loads(out.strip().splitlines()[-1])
    assert report["timeout"], report
    assert TIMEOUT_S - 0.5 <= report["waited"] <= TIMEOUT_S + 10, report  # the group's timeout, not 30 minutes
    assert f"rank 1 on host {os.uname().nodename} (pid {ranks[1].pid}) stopped answering" in report["line"], report
    assert took < 90, took


@pytest.mark.cuda
def test_on_a_gpu_the_flight_recorder_records_the_collectives_of_a_group_made_by_init_distributed(tmp_path):
    """NCCL's watchdog settings are read when the group is made: init_distributed sets them first, and the flight
    recorder then holds the group's collectives (what a timeout dumps into RUN_DIR/flight-recorder/)."""
    script = textwrap.dedent(
        """
        import os, pickle, sys, torch, torch.distributed as dist
        from imagenet_train.training.dist import init_distributed
        info = init_distributed(60, sys.argv[1])
        dist.all_reduce(torch.ones(4, device=info.device))
        torch.cuda.synchronize()
        trace = pickle.loads(torch._C._distributed_c10d._dump_nccl_trace())
        names = sorted({entry.get("profiling_name", "") for entry in trace.get("entries", [])})
        print(os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"], names)
        dist.destroy_process_group()
        """
    )
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: NCCL refuses two ranks on one device, and a world of one makes no group")
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "run")],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [rank.communicate(timeout=180) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), outputs
    assert f"{tmp_path / 'run' / 'flight-recorder'}/rank-" in outputs[0][0], outputs
    assert "nccl:all_reduce" in outputs[0][0], outputs
