"""`imagenet-train plan` run as a command: the simulation over real shards, exit 1 on a hang, --json and
one-line errors for bad input."""

import json

from conftest import cli


def test_plan_command_simulates_real_shards_and_exits_1_on_a_hang(digit_shards):
    result = cli(
        "plan",
        "--shards",
        str(digit_shards),
        "--gpus-per-node",
        "2",
        "--workers",
        "2",
        "--batch-size",
        "32",
        "--mode",
        "split",
        "--simulate",
        "--show-open",
        "--show-workers",
    )
    assert result.returncode == 0, result.stderr
    assert "simulation: the real loaders gave exactly the planned batches on all 2 ranks" in result.stdout
    assert "worker 1 opened: imagenet-train-train-" in result.stdout
    hang = cli(
        "plan",
        "--nshards",
        "10",
        "--samples-per-shard",
        "100",
        "--gpus-per-node",
        "4",
        "--mode",
        "split",
        "--no-join",
        "--batch-size",
        "32",
    )
    assert hang.returncode == 1 and "verdict: WILL HANG" in hang.stdout


def test_plan_json_and_bad_input():
    doc = json.loads(cli("plan", "--shard-sizes", "10,20,30", "--json", "--batch-size", "4", "--workers", "1").stdout)
    assert doc["verdict"] == "OK" and [r["batches"] for r in doc["ranks"]] == [15]
    bad = cli("plan", "--shard-sizes", "10,x")
    assert bad.returncode == 2 and "--shard-sizes: expected whole numbers >= 1" in bad.stderr
