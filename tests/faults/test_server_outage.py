"""The shard server (a real nginx) stopped mid-epoch and started again on the same port: the run waits
it out within --io-timeout and finishes, every sample once in the exact modes, the epoch's length kept
in resampled mode."""

from __future__ import annotations

import pytest

from imagenet_train.ops.serve import free_port
from imagenet_train.planning import plan

from .injectors import RestartableNginx, timed_outage, train_keys
from .runs import (
    FAULT_TRAIN,
    Row,
    TorchRun,
    account_exact,
    account_resampled,
    logged_train_keys,
    metrics,
    outcome_of,
    step_checkpoint,
    traceback_in,
    wall_lost,
)


def outage_during_epoch(shards, tmp_path, mode: str, seconds: float, record, baselines) -> None:
    """Train from nginx, stop nginx once step 4's checkpoint exists, start it `seconds` later; check the run."""
    run_dir = tmp_path / "run"
    # Default --io-timeout and --loader-timeout (on purpose): the defaults must ride out these outages.
    # One worker per rank (the DataLoader runs 4 batches ahead of each) and a small shuffle buffer keep
    # shard opens spread over the whole epoch instead of all at its start: the outage meets some.
    args = ["--mode", mode, *FAULT_TRAIN, "--shuffle-buffer", "10", "--workers", "1"]
    server = RestartableNginx(str(shards), port=free_port())
    server.start()
    try:
        run = TorchRun(["--shards", f"{server.url}/shards.json", "--run-dir", str(run_dir), *args], tmp_path / "a.log")
        run.wait_for(step_checkpoint(run_dir, 4).exists, 300, "a checkpoint at step 4")
        outage = timed_outage(server.down, server.up, seconds)
        code = run.wait(timeout=seconds + 600)
    finally:
        server.stop()
    text = run.output()
    keys = logged_train_keys(run_dir)
    if mode == "resampled":
        nominal = plan.resampled_epoch_batches(len(train_keys(shards)), 16, 2) * 16 * 2
        accounting = account_resampled(keys, nominal)
    else:
        accounting = account_exact(keys, train_keys(shards))
    baseline = baselines.over_nginx(f"many-{mode}", shards, args)
    record(
        Row(
            fault=f"nginx stopped mid-epoch, back on the same port after {seconds:.0f} s",
            mode=mode,
            outcome=outcome_of(code, text),
            lost=accounting.lost,
            repeated=accounting.repeated,
            wall_lost_s=wall_lost(run.seconds, baseline),
            seconds=round(run.seconds, 1),
            notes=[f"server down {outage['down_s']:.0f} s"],
        )
    )
    assert code == 0, f"the run did not survive a {seconds:.0f}s outage:\n{text[-4000:]}"
    assert not traceback_in(text)
    assert "waiting for " in text and "--io-timeout" in text, "no 'waiting for URL' warning during the outage"
    assert accounting.lost == 0 and accounting.unexpected == 0, accounting
    if mode != "resampled":
        assert accounting.repeated == 0, accounting
    assert metrics(run_dir)[-1]["train_samples"] == accounting.seen
    assert run.seconds > seconds


@pytest.mark.timeout(900)
def test_split_run_rides_out_a_30s_shard_server_outage(many_shards, tmp_path, record, baselines):
    outage_during_epoch(many_shards, tmp_path, "split", 30, record, baselines)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_resampled_run_rides_out_a_60s_shard_server_outage(many_shards, tmp_path, record, baselines):
    outage_during_epoch(many_shards, tmp_path, "resampled", 60, record, baselines)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_split_run_rides_out_a_5min_shard_server_outage(many_shards, tmp_path, record, baselines):
    outage_during_epoch(many_shards, tmp_path, "split", 300, record, baselines)
