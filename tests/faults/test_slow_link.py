"""A slow, lossy link between trainer and shard server: nginx inside a network namespace this test
creates, reached over a veth pair capped by tbf (rate limit and queueing delay) with 5% of packets
dropped at random each way by iptables' statistic match. (This kernel has no netem qdisc.)"""

from __future__ import annotations

import pytest

from .injectors import namespace, nginx_in_namespace, train_keys
from .runs import FAULT_TRAIN, Row, account_exact, logged_train_keys, outcome_of, run_to_end, traceback_in, wall_lost

RATE, LATENCY_MS, DROP = "4mbit", 200, 0.05


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_split_run_finishes_over_a_slow_lossy_link(four_shards, tmp_path, record, baselines):
    config = ["--mode", "split", *FAULT_TRAIN]
    baseline = baselines.over_nginx("four-split", four_shards, config)
    with namespace() as ns:
        ns.shape(RATE, LATENCY_MS)
        ns.drop(DROP)
        with nginx_in_namespace(ns, four_shards) as url:
            run_dir = tmp_path / "run"
            args = ["--shards", f"{url}/shards.json", "--run-dir", str(run_dir), *config]
            run = run_to_end(args, tmp_path / "a.log", 800)
    text, code = run.output(), run.process.returncode
    accounting = account_exact(logged_train_keys(run_dir), train_keys(four_shards))
    record(
        Row(
            fault=f"shard server in a netns behind a veth pair: tbf {RATE} (queue up to {LATENCY_MS} ms), "
            f"{DROP:.0%} packets dropped each way",
            mode="split",
            outcome=outcome_of(code, text),
            lost=accounting.lost,
            repeated=accounting.repeated,
            wall_lost_s=wall_lost(run.seconds, baseline),
            seconds=round(run.seconds, 1),
            notes=["netem is not in this kernel: tbf + iptables statistic DROP instead"],
        )
    )
    assert code == 0, text[-4000:]
    assert not traceback_in(text)
    assert accounting.lost == 0 and accounting.repeated == 0 and accounting.unexpected == 0, accounting
