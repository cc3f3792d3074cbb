"""`imagenet-train preflight` and `train --preflight` under a real torchrun (gloo, 2 ranks): every rank's checks,
the record rank 0 writes, and one line per failing rank naming its host, with exit code 3."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SMALL_TRAIN


def ranks(command: str, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=2 imagenet-train COMMAND ...` in a session of its own (a hang fails the test)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m"]
        + ["imagenet_train.cli", command, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{command} did not finish within {timeout}s:\n{stderr[-3000:]}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def exited_3(result: subprocess.CompletedProcess) -> bool:
    """Every rank exited 3. Plain torchrun exits 1 on any failed rank and reports each rank's own code;
    `imagenet-train launch` (the chart's pods) exits with the ranks' code, 3."""
    return result.returncode == 1 and result.stderr.count("exitcode  : 3") + result.stderr.count("(exitcode: 3)") >= 2


def dead_url() -> str:
    """An index URL on a port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/shards.json"


def test_preflight_passes_on_two_cpu_ranks_and_records_every_ranks_checks(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    result = ranks("preflight", [*SMALL_TRAIN, "--shards", str(digit_shards), "--run-dir", str(run_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "preflight: passed on 2 rank(s)" in result.stdout
    record = json.loads((run_dir / "preflight.json").read_text())
    assert record["verdict"] == "passed" and [r["rank"] for r in record["ranks"]] == [0, 1]
    for rank in record["ranks"]:
        checks = {check["name"]: check for check in rank["checks"]}
        assert set(checks) == {"device", "memory", "all-reduce", "index", "run-dir"}
        assert checks["device"]["skipped"] and "no CUDA device" in checks["device"]["detail"]  # a CPU: said why
        assert "GB/s over 2 ranks" in checks["all-reduce"]["detail"] and not checks["all-reduce"]["skipped"]
        assert checks["index"]["ok"] and "train shards" in checks["index"]["detail"]


@pytest.mark.slow  # a 2-rank torchrun each; make faults runs them, make test the passing preflight
def test_a_bandwidth_floor_no_link_reaches_names_every_rank_and_host_once_and_exits_3(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    floor = ["--preflight-min-busbw", "100000"]  # 100 TB/s: no interconnect, let alone loopback gloo
    result = ranks("preflight", [*SMALL_TRAIN, "--shards", str(digit_shards), "--run-dir", str(run_dir), *floor])
    assert exited_3(result), result.stderr[-3000:]
    failed = [line for line in result.stderr.splitlines() if "preflight: rank" in line]
    host = socket.gethostname()
    assert sorted(failed) == sorted(
        line for line in failed if line.startswith("imagenet-train: error: preflight: rank ")
    )
    assert len(failed) == 2, result.stderr[-3000:]  # one line per failing rank, printed once (by rank 0)
    for rank in (0, 1):
        assert any(f"rank {rank} on {host}: all-reduce failed: bus bandwidth" in line for line in failed), failed
    assert "imagenet_train/" not in result.stderr  # no traceback of ours (torchrun prints its own)
    assert json.loads((run_dir / "preflight.json").read_text())["verdict"] == "failed"


@pytest.mark.slow  # a 2-rank torchrun each; make faults runs them, make test the passing preflight
def test_train_with_preflight_stops_before_training_when_the_index_does_not_answer(tmp_path):
    run_dir = tmp_path / "run"
    args = [*SMALL_TRAIN, "--shards", dead_url(), "--run-dir", str(run_dir), "--preflight", "--io-timeout", "3"]
    result = ranks("train", args)
    assert exited_3(result), result.stderr[-3000:]
    failed = [line for line in result.stderr.splitlines() if "preflight: rank" in line]
    assert len(failed) == 2 and all("index failed" in line for line in failed), result.stderr[-3000:]
    assert not (run_dir / "metrics.jsonl").exists()  # nothing trained
    assert json.loads((run_dir / "preflight.json").read_text())["verdict"] == "failed"


def test_a_run_directory_without_room_for_two_checkpoints_fails_its_check(tmp_path):
    from imagenet_train.ops.preflight import run_dir_check

    free = __import__("shutil").disk_usage(tmp_path).free
    check = run_dir_check(str(tmp_path / "run"), needed=free)  # two of them cannot fit
    assert not check.ok and "two checkpoints take" in check.detail
    assert run_dir_check(str(tmp_path / "run"), needed=1).ok
    assert not list(Path(tmp_path / "run").iterdir())  # the probe file is gone
