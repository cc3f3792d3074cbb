"""A rank that stops answering mid-epoch (SIGSTOP: a frozen process, a hung node) no longer holds the job for the
process group's half hour: the other rank's collective times out after --collective-timeout, and it leaves in one
line naming the rank and host that stopped answering, with the retry code the launchers restart on (138).

Two nodes as `imagenet-train ssh` starts them (a static world, one `launch` and one rank each), so the survivor's
launcher exit code is what a PyTorchJob, an Indexed Job or Slurm's requeue sees. The message's arithmetic is in
tests/unit/test_liveness.py, the same timeout in a bare gloo world in tests/integration/test_hung_rank.py.

The other side of the limit: a shard-server outage that a rank rides out holds the other rank in the step's
collective, and a limit of at least --loader-timeout (what the settings check enforces) lets the run finish."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time

import pytest

from imagenet_train.errors import RETRY_EXIT
from imagenet_train.ops.serve import NginxServer, free_port

from .injectors import RestartableNginx, timed_outage
from .runs import FAULT_TRAIN, Row, TorchRun, outcome_of, step_checkpoint, traceback_in
from conftest import LONG_EPOCH, child_pids

TIMEOUT_S = 45  # --collective-timeout: short, so the test bounds its own wait (the old code waits 30 min)
MARGIN_S = 40  # reading the heartbeats (2.5 beats of 1.1 s), leaving, the launcher's exit; a loaded machine
# --loader-timeout must cover the first batch of loader workers starting on a loaded machine; the limit is at least it
SHORT_WAITS = ["--io-timeout", "20", "--loader-timeout", str(TIMEOUT_S), "--collective-timeout", str(TIMEOUT_S)]


@pytest.mark.slow  # about 2 minutes (two launchers start, train to a checkpoint, then the timeout)
@pytest.mark.timeout(900)
def test_a_rank_stopped_mid_epoch_makes_the_other_leave_within_the_timeout_naming_it(four_shards, tmp_path, record):
    run_dir = tmp_path / "run"
    port = str(free_port())
    with NginxServer(str(four_shards)) as server:
        args = ["--shards", f"{server.url}/shards.json", "--run-dir", str(run_dir), *FAULT_TRAIN, *LONG_EPOCH]

        def node(rank: int) -> TorchRun:
            env = {"IMAGENET_TRAIN_NNODES": "2", "IMAGENET_TRAIN_NODE_RANK": str(rank)}
            env |= {"IMAGENET_TRAIN_MASTER_ADDR": "127.0.0.1", "IMAGENET_TRAIN_MASTER_PORT": port}
            return TorchRun([*args, *SHORT_WAITS], tmp_path / f"node{rank}.log", nproc=1, env=env, launch=True)

        survivor, hung = node(0), node(1)
        try:
            survivor.wait_for(step_checkpoint(run_dir, 4).exists, 300, "a checkpoint at step 4")
            ranks = child_pids(hung.process.pid)
            assert len(ranks) == 1, ranks
            os.kill(ranks[0], signal.SIGSTOP)
            stopped = time.monotonic()
            code = survivor.wait(timeout=TIMEOUT_S + MARGIN_S + 60)
            took = time.monotonic() - stopped
        finally:
            with contextlib.suppress(ProcessLookupError):
                hung.stop_hard()  # SIGKILL ends a stopped process too
            survivor.stop_hard()
    text = survivor.output()
    errors = [line for line in text.splitlines() if line.startswith("imagenet-train: error:")]
    record(
        Row(
            fault=f"one rank stopped mid-epoch (SIGSTOP) under --collective-timeout {TIMEOUT_S}",
            mode="resampled",
            outcome=f"the other rank left with exit {code} after {took:.0f} s, in one line: "
            + (errors[0].split(": ", 2)[-1] if errors else "none"),
            seconds=round(survivor.seconds, 1),
            notes=["a stopped rank's heartbeat (the job's store) stops with it: the survivor names it and its host"],
        )
    )
    assert code == RETRY_EXIT, f"expected exit {RETRY_EXIT}, got {code}:\n{text[-4000:]}"
    assert took < TIMEOUT_S + MARGIN_S, f"left {took:.0f} s after the stop:\n{text[-3000:]}"
    assert not traceback_in(text), text[-4000:]
    assert len(errors) == 1, text[-3000:]
    assert f"rank 1 on host {socket.gethostname()} (pid {ranks[0]}) stopped answering" in errors[0], errors[0]
    assert f"--collective-timeout {TIMEOUT_S} s" in errors[0], errors[0]


OUTAGE_S = 20
# An outage's reads retry with backoff capped at 30 s and give up when the next retry would pass --io-timeout, so
# the budget is well over the outage; --loader-timeout covers the outage and a last backoff, and the collective limit
# is the least the settings check allows: --loader-timeout.
OUTAGE_WAITS = ["--io-timeout", "120", "--loader-timeout", "150", "--collective-timeout", "150"]


@pytest.mark.slow  # about 2 minutes
@pytest.mark.timeout(900)
def test_an_outage_a_rank_rides_out_inside_the_others_collective_does_not_time_it_out(many_shards, tmp_path, record):
    run_dir = tmp_path / "run"
    args = ["--mode", "split", *FAULT_TRAIN, "--shuffle-buffer", "10", "--workers", "1", *OUTAGE_WAITS]
    server = RestartableNginx(str(many_shards), port=free_port())
    server.start()
    try:
        run = TorchRun(["--shards", f"{server.url}/shards.json", "--run-dir", str(run_dir), *args], tmp_path / "a.log")
        run.wait_for(step_checkpoint(run_dir, 4).exists, 300, "a checkpoint at step 4")
        outage = timed_outage(server.down, server.up, OUTAGE_S)
        code = run.wait(timeout=600)
    finally:
        server.stop()
    text = run.output()
    record(
        Row(
            fault=f"nginx stopped mid-epoch for {OUTAGE_S} s under --collective-timeout 150 (= --loader-timeout)",
            mode="split",
            outcome=outcome_of(code, text),
            seconds=round(run.seconds, 1),
            notes=[f"server down {outage['down_s']:.0f} s"],
        )
    )
    assert code == 0, f"the outage ended the run:\n{text[-4000:]}"
    assert "waiting for " in text, "the outage met no read: nothing waited"
    assert not traceback_in(text) and "stopped answering" not in text
