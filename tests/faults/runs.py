"""Driving a 2-rank torchrun through a fault and accounting for it: which samples were lost or repeated
(from the `--log-keys` files and metrics.jsonl), how much wall time it cost, and the table row it makes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from imagenet_train.planning.position import Position
from imagenet_train.rundir.checkpoint import latest, load
from imagenet_train.rundir.directory import epoch_folder

from conftest import CHECKPOINTING_TRAIN, child_pids

# One small configuration for every fault: 1 epoch, a checkpoint every 4 steps (the mid-epoch marker the
# tests wait for), every sample key logged. Each test adds --shards, --mode, --run-dir and its own timeouts.
FAULT_TRAIN = [*CHECKPOINTING_TRAIN, "--log-keys"]


def step_checkpoint(run_dir: Path, step: int) -> Path:
    """Where --checkpoint-every writes the epoch-0 checkpoint of global step `step`."""
    return run_dir / "checkpoints" / f"epoch-0000-step-{step:06d}.pt"


class TorchRun:
    """`torchrun --nproc_per_node=N -m imagenet_train.cli train ARGS` in its own session, output to a log file;
    with `launch`, through `imagenet-train launch` (the image's entrypoint, torchrun in-process)."""

    def __init__(
        self, args: list[str], log: Path, nproc: int = 2, env: dict[str, str] | None = None, launch: bool = False
    ):
        if launch:
            command = [str(Path(sys.executable).with_name("imagenet-train")), "launch", "--nproc-per-node", str(nproc)]
            command += ["--", "train", *args]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
            command += ["-m", "imagenet_train.cli", "train", *args]
        self.log = log
        self._stream = open(log, "w")  # noqa: SIM115 (closed in wait)
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command,
            stdout=self._stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        )
        self.seconds = 0.0

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll until `condition()` holds; fail (and end the run) if the run exits first or time runs out."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                self.stop_hard()
                pytest.fail(f"run exited ({self.process.returncode}) before {what}:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                self.stop_hard()
                pytest.fail(f"no {what} within {timeout:.0f}s:\n{self.output()[-3000:]}")
            time.sleep(0.05)

    def send(self, signum: int) -> None:
        """Send a signal to torchrun (or `imagenet-train launch`) itself, as a scheduler pre-empting the job would."""
        os.kill(self.process.pid, signum)

    def kill_rank(self, signum: int = signal.SIGKILL) -> int:
        """Send a signal to the last rank process; returns its pid."""
        ranks = child_pids(self.process.pid)
        assert ranks, "no rank processes found"
        os.kill(ranks[-1], signum)
        return ranks[-1]

    def lose_node(self) -> None:
        """SIGKILL the launcher and every process under it at once, as a killed pod's cgroup or a lost node goes
        (torchrun starts its ranks in sessions of their own, so killing the launcher's group would leave them)."""
        tree, index = [self.process.pid], 0
        while index < len(tree):
            tree += child_pids(tree[index])
            index += 1
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()
        self.seconds = time.monotonic() - self.started
        self._stream.close()

    def wait(self, timeout: float) -> int:
        """Wait for the run to end; a run still going after `timeout` is a hang: killed, and the test fails."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop_hard()
            pytest.fail(f"run did not end within {timeout:.0f}s (hang?):\n{self.output()[-3000:]}")
        self.seconds = time.monotonic() - self.started
        self._stream.close()
        return code

    def stop_hard(self) -> None:
        """SIGKILL the whole session (torchrun, ranks, DataLoader workers)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.seconds = time.monotonic() - self.started
        self._stream.close()

    def output(self) -> str:
        """Everything the run printed so far (stdout and stderr together)."""
        if not self._stream.closed:
            self._stream.flush()
        return self.log.read_text(errors="replace")


def run_to_end(args: list[str], log: Path, timeout: float, nproc: int = 2, launch: bool = False) -> TorchRun:
    """Run training to its end (no fault) and return the finished run."""
    run = TorchRun(args, log, nproc, launch=launch)
    run.wait(timeout)
    return run


def traceback_in(text: str) -> bool:
    """Whether a Python traceback was printed (a fault must end in one line, never a traceback)."""
    return "Traceback (most recent call last)" in text


def metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl's records (empty if none were written)."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def logged_train_keys(run_dir: Path, epoch: int = 0) -> Counter:
    """How often each training key was read in an epoch, over all ranks and run segments (`--log-keys`)."""
    counts: Counter = Counter()
    for path in sorted((run_dir / "keys").glob(f"train-epoch{epoch:04d}-rank*.txt")):
        counts.update(line for line in path.read_text().splitlines() if line)
    return counts


@dataclass
class Accounting:
    """Samples of an epoch against what it should have held: lost (never read) and repeated (read twice+)."""

    expected: int
    seen: int
    lost: int
    repeated: int
    unexpected: int
    broken_lost: int = 0  # samples a broken shard held past its damage (counted by the trainer)


def account_exact(counts: Counter, expected: set[str], broken_lost: int = 0) -> Accounting:
    """For split/queue: every expected key once; keys a broken shard held are lost but counted separately."""
    seen = set(counts)
    return Accounting(
        expected=len(expected),
        seen=sum(counts.values()),
        lost=len(expected - seen),
        repeated=sum(n - 1 for n in counts.values() if n > 1),
        unexpected=len(seen - expected),
        broken_lost=broken_lost,
    )


def account_resampled(counts: Counter, nominal_samples: int) -> Accounting:
    """For resampled: the epoch's length is the promise (samples are drawn at random, so repeats are normal)."""
    seen = sum(counts.values())
    return Accounting(
        expected=nominal_samples,
        seen=seen,
        lost=max(0, nominal_samples - seen),
        repeated=max(0, seen - nominal_samples),
        unexpected=0,
    )


@dataclass
class Row:
    """One line of docs/reliability.md's table."""

    fault: str
    mode: str
    outcome: str
    lost: int | None = None
    repeated: int | None = None
    broken_lost: int | None = None
    wall_lost_s: float | None = None
    seconds: float = 0.0
    test: str = ""
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> str:
        return json.dumps(asdict(self))


def outcome_of(code: int, text: str) -> str:
    """How a run part ended, in the table's words."""
    if code == 0:
        return "finished"
    if code > 128 or code < 0:
        signum = code - 128 if code > 128 else -code
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
        if "forcefully exiting via 9" in text:
            return f"ranks did not stop on {name} within the shutdown timeout: SIGKILLed (exit {code})"
        if traceback_in(text):
            return f"died on {name} (exit {code}, traceback)"
        if not re.search(rf"stopped by {name} at epoch \d+ step \d+: checkpoint", text):
            return f"exit {code} on {name} without a stop checkpoint"
        return f"stopped cleanly on {name} (exit {code})"
    ours = [line for line in text.splitlines() if line.startswith("imagenet-train: error:")]
    others = [
        line
        for line in text.splitlines()
        if re.search(r"\b[A-Z]\w*(Error|Exception): \S", line) and "ChildFailedError" not in line
    ]
    detail = (ours[:1] or others[:1] or [""])[0].strip()[:200]
    if code == 2 and not traceback_in(text):
        return f"stopped cleanly (exit 2: {detail})"
    return f"FAILED (exit {code}: {detail})"


def checkpoint_position(run_dir) -> Position:
    """The data position saved in the newest checkpoint of a run directory."""
    state = load(latest(str(run_dir)))  # weights_only: the checkpoint is tensors and plain data
    return Position.from_dict(state["position"])


def keys_after(run_dir, step: int) -> list[str]:
    """Keys the ranks fetched in the epoch-0 segment that started at `step` (the position key logs)."""
    found: list[str] = []
    for log in epoch_folder(run_dir, 0).glob(f"rank-*-from-{step:06d}.keys"):
        found += [key for line in log.read_text().splitlines() for key in line.split()[1:]]
    return found


def wall_lost(seconds: float, baseline: float | None) -> float | None:
    """Wall time a fault cost over the clean run (None when no baseline was measured)."""
    return None if baseline is None else round(seconds - baseline, 1)
