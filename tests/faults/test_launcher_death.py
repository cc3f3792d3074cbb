"""No rank outlives its launcher: SIGTERM to torchrun's agent or to `imagenet-train launch` reaches every rank at
once, and a rank whose launcher is SIGKILLed stops by itself with its DataLoader workers. Each run waits on an
outage (an index or shard server nobody listens on) when the signal comes: a rank then has no step boundary to
stop at, and its loader workers are blocked in a read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imagenet_train.ops.serve import free_port

from .runs import FAULT_TRAIN, Row, TorchRun

REFUSED = "Connection refused"  # in the line a wait on the outage logs first, whatever its wording


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first); None once the process is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else fields


def run_processes(root: int) -> set[int]:
    """Every live process of a run: the tree below `root`, and anything in the sessions of that tree (torchrun
    starts each rank in a session of its own; a process re-parented to init stays in its session)."""
    parents, sessions = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(int(stat.parent.name))
        if fields:
            parents[int(stat.parent.name)] = int(fields[1])
            sessions[int(stat.parent.name)] = int(fields[3])
    tree, todo = {root} & parents.keys(), [root]
    while todo:
        parent = todo.pop()
        for pid, its_parent in parents.items():
            if its_parent == parent and pid not in tree:
                tree.add(pid)
                todo.append(pid)
    run_sessions = {sessions[pid] for pid in tree} - {sessions.get(os.getpid())}
    return tree | {pid for pid, session in sessions.items() if session in run_sessions}


def ranks_of(launcher: int) -> list[int]:
    """The rank processes: children of the launcher that run the imagenet-train CLI."""
    found = []
    for pid in run_processes(launcher):
        fields = _stat(pid)
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if fields and int(fields[1]) == launcher and b"imagenet_train.cli" in command:
            found.append(pid)
    return sorted(found)


def torch_loaded(pid: int) -> bool:
    """Whether a rank got as far as importing torch (its CLI, and so its watch on the launcher, has started)."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def gone_after(processes: set[int], timeout: float) -> tuple[float, set[int]]:
    """Seconds until none of `processes` is alive (at most `timeout`), and those still alive then."""
    started = time.monotonic()
    alive = set(processes)
    while alive and time.monotonic() - started < timeout:
        time.sleep(0.05)
        alive = {pid for pid in alive if _stat(pid)}
    return time.monotonic() - started, alive


def kill_all(processes: set[int]) -> None:
    """Leave nothing to the machine when a check fails."""
    for pid in processes:
        if _stat(pid):
            os.kill(pid, signal.SIGKILL)


def index_on_a_down_server(shards: Path, folder: Path) -> Path:
    """A copy of the index whose shards live on a port nobody listens on (read with --trust-index)."""
    document = json.loads((shards / "shards.json").read_text())
    dead = f"http://127.0.0.1:{free_port()}/"
    for split in document["splits"].values():
        for shard in split["shardlist"]:
            shard["url"] = dead + shard["url"]
    document["shardlist"] = document["splits"]["train"]["shardlist"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "shards.json").write_text(json.dumps(document))
    return folder / "shards.json"


def waiting_run(tmp_path: Path, shards: str, launch: bool, env: dict[str, str], extra: list[str] = ()) -> TorchRun:
    """2 ranks of `train` started and waiting on the outage (their loaders too when the index is readable)."""
    args = ["--shards", shards, "--run-dir", str(tmp_path / "run"), *FAULT_TRAIN, *extra]
    # A TMPDIR of its own: the node's once-a-minute "waiting for" line is not held back by another test's.
    run = TorchRun(args, tmp_path / "run.log", launch=launch, env={"TMPDIR": str(tmp_path), **env})
    ranks = lambda: ranks_of(run.process.pid)  # noqa: E731
    run.wait_for(lambda: len(ranks()) == 2 and all(map(torch_loaded, ranks())), 180, "2 ranks")
    run.wait_for(lambda: REFUSED in run.output(), 180, "a rank waiting on the outage")
    return run


@pytest.mark.timeout(300)
def test_sigkill_to_torchrun_agent_leaves_no_rank_or_loader_worker_behind(four_shards, tmp_path, record):
    """The agent SIGKILLed while every loader worker waits on a down shard server: the ranks see their launcher
    gone, stop as on SIGTERM and are killed with their workers after the grace (3 s here): nothing is left."""
    index = index_on_a_down_server(four_shards, tmp_path / "index")
    # torchrun's own grace setting (its --shutdown-timeout), which the ranks read too.
    env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "3"}
    run = waiting_run(tmp_path, str(index), launch=False, env=env, extra=["--trust-index", "--workers", "1"])
    run.wait_for(lambda: len(run_processes(run.process.pid)) >= 7, 120, "loader processes below the ranks")
    before = run_processes(run.process.pid)
    run.send(signal.SIGKILL)
    seconds, left = gone_after(before - {run.process.pid}, 30)
    run.stop_hard()
    kill_all(left)
    record(
        Row(
            fault="SIGKILL to torchrun's agent while the loaders wait on a down shard server (grace 3 s)",
            mode="resampled",
            outcome=f"all {len(before) - 1} processes below the agent gone after {seconds:.1f} s"
            if not left
            else f"{len(left)} of {len(before) - 1} processes below the agent still running after {seconds:.0f} s",
            seconds=round(seconds, 1),
            notes=["ranks stop as on SIGTERM when their launcher dies, and are killed after its grace period"],
        )
    )
    assert not left, f"still running {seconds:.0f} s after the agent's SIGKILL: {sorted(left)}\n{run.output()[-3000:]}"
    assert seconds < 10
    assert run.output().count("its launcher (pid") == 2


@pytest.mark.slow  # 100 s, and it fails until #33's cancellable waits land (then about 10 s)
@pytest.mark.timeout(300)
def test_sigkill_to_launch_leaves_no_process_of_the_run_within_10s(tmp_path, record):
    """`imagenet-train launch` SIGKILLed while both ranks wait for an unreachable index, with its default grace.

    Needs the cancellable waits of #33 (a rank that gets SIGTERM in a wait exits within 5 s): before them a
    rank waits out the launcher's whole grace period (80 s) before its watch kills it."""
    run = waiting_run(tmp_path, f"http://127.0.0.1:{free_port()}/shards.json", launch=True, env={})
    before = run_processes(run.process.pid)
    run.send(signal.SIGKILL)
    seconds, left = gone_after(before - {run.process.pid}, 100)
    run.stop_hard()
    kill_all(left)
    record(
        Row(
            fault="SIGKILL to `imagenet-train launch` while the ranks wait for an unreachable index",
            mode="resampled",
            outcome=f"no process of the run left after {seconds:.1f} s"
            if not left
            else f"{len(left)} processes of the run still running after {seconds:.0f} s",
            seconds=round(seconds, 1),
        )
    )
    assert not left and seconds < 10, f"{seconds:.0f} s until no process was left:\n{run.output()[-3000:]}"


@pytest.mark.slow  # 60 s, and it fails until #33's cancellable waits land (then about 10 s)
@pytest.mark.timeout(300)
def test_sigterm_to_torchrun_agent_during_an_outage_leaves_no_process_after_10s(tmp_path, record):
    """SIGTERM to torchrun's agent while both ranks wait for an unreachable index: the agent signals every
    rank's process group at once; each rank must leave its wait and exit, so nothing is left after 10 s.

    Needs the cancellable waits of #33: before them the ranks sit out torchrun's 30 s shutdown timeout."""
    run = waiting_run(tmp_path, f"http://127.0.0.1:{free_port()}/shards.json", launch=False, env={})
    before = run_processes(run.process.pid)
    run.send(signal.SIGTERM)
    seconds, left = gone_after(before, 60)
    code = run.wait(timeout=60)
    record(
        Row(
            fault="SIGTERM to torchrun's agent while the ranks wait for an unreachable index",
            mode="resampled",
            outcome=f"torchrun exit {code}; no process of the run left after {seconds:.1f} s"
            if not left
            else f"torchrun exit {code}; {len(left)} processes left after {seconds:.0f} s",
            seconds=round(seconds, 1),
        )
    )
    kill_all(left)
    assert not left and seconds < 10, f"{seconds:.0f} s until no process was left:\n{run.output()[-3000:]}"
    assert "forcefully exiting via 9" not in run.output(), "torchrun had to SIGKILL a rank"


@pytest.mark.timeout(120)
def test_sigterm_to_launch_reaches_every_rank_at_once(tmp_path, record):
    """`imagenet-train launch` of 2 ranks that wait for an unreachable index (`probe --wait`, which keeps the
    default action of SIGTERM: it dies of the signal the moment it gets it); SIGTERM to launch must end both
    ranks at once, not after the launcher's grace period, and launch exits 143."""
    command = [str(Path(sys.executable).with_name("imagenet-train")), "launch", "--nproc-per-node", "2", "--"]
    command += ["probe", "--wait", "600", f"http://127.0.0.1:{free_port()}/shards.json"]
    log = tmp_path / "launch.log"
    with open(log, "w") as stream:
        launch = subprocess.Popen(
            command,
            stdout=stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "TMPDIR": str(tmp_path)},
        )
    try:
        deadline = time.monotonic() + 90
        while REFUSED not in log.read_text() or len(ranks_of(launch.pid)) < 2:
            assert launch.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        ranks = ranks_of(launch.pid)
        launch.send_signal(signal.SIGTERM)
        started, ended = time.monotonic(), {}
        while len(ended) < len(ranks) and time.monotonic() - started < 30:
            ended.update({pid: time.monotonic() - started for pid in ranks if pid not in ended and not _stat(pid)})
            time.sleep(0.01)
        code = launch.wait(timeout=60)
    finally:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
    milliseconds = ", ".join(f"{seconds * 1000:.0f}" for seconds in sorted(ended.values()))
    record(
        Row(
            fault="SIGTERM to `imagenet-train launch` while its ranks wait for an unreachable index (probe --wait)",
            mode="-",
            outcome=f"launch exit {code}; the ranks ended {milliseconds} ms after the signal",
            seconds=round(max(ended.values(), default=30), 1),
        )
    )
    assert sorted(ended) == ranks, f"ranks still running 30 s after SIGTERM: {set(ranks) - set(ended)}"
    assert max(ended.values()) < 5 and max(ended.values()) - min(ended.values()) < 1, ended
    assert code == 128 + signal.SIGTERM, log.read_text()[-3000:]
