"""TrainJob progress (Kubeflow Trainer's status endpoint) against a real HTTPS stand-in on 127.0.0.1 that checks
the token, serves a certificate of the CA the run is given, and validates every body against the vendored
TrainJob CRD's `trainerStatus` schema and CEL rules (tests/status_server.py)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from status_server import StatusServer, body_problems, make_pki

from imagenet_train.training import progress
from imagenet_train.training.status_client import CA_VAR, TOKEN_VAR, URL_VAR, status_body

from conftest import REPO, SMALL_TRAIN, read_metrics, torchrun

# Two short epochs (8 steps each, the second evaluated): epoch ends at 50% and 100%.
SHORT_RUN = [*SMALL_TRAIN, "--epochs", "2", "--epoch-batches", "8"]
TOKEN = "eyJhbGciOiJSUzI1NiJ9.test-token.signature"


@pytest.fixture
def pki(tmp_path):
    """The run's CA with a server certificate for 127.0.0.1, another CA's, and the token file."""
    ca, cert, key = make_pki(tmp_path / "trainer")
    _, other_cert, other_key = make_pki(tmp_path / "other", name="other")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    return SimpleNamespace(ca=ca, cert=cert, key=key, other_cert=other_cert, other_key=other_key, token=token)


def trainer_env(url: str, pki) -> dict[str, str]:
    return {URL_VAR: url, CA_VAR: str(pki.ca), TOKEN_VAR: str(pki.token)}


def test_rank0_reports_rising_progress_that_reaches_100_at_the_end(digit_shards, pki, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    with StatusServer(pki.cert, pki.key, TOKEN) as server:
        for name, value in trainer_env(server.url, pki).items():
            monkeypatch.setenv(name, value)  # torchrun passes them to both ranks, as the Trainer sets them in the pod
        result = torchrun([*SHORT_RUN, "--shards", str(digit_shards), "--run-dir", str(run_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    received = server.received
    assert received.problems == []
    percentages = received.percentages()
    # Rising (an epoch's last step may post its 50 before the epoch's end posts it again); rank 0 alone: a
    # second poster would post 100 at the end too, and the line below would count two.
    assert len(set(percentages)) >= 3 and percentages == sorted(percentages), percentages
    assert percentages[-1] == 100 and percentages.count(100) == 1
    assert percentages[0] < 50 <= percentages[-2] < 100
    assert result.stderr.count("trainer status: reporting progress to") == 1
    final = received.statuses[-1]
    assert final["estimatedRemainingSeconds"] == 0
    metrics = {m["name"]: float(m["value"]) for m in final["metrics"]}
    last = read_metrics(run_dir)[-1]
    assert metrics["epoch"] == 1 and metrics["top1"] == pytest.approx(last["top1"], rel=1e-5)
    assert metrics["loss"] == pytest.approx(last["train_loss"], rel=1e-5) and metrics["img_per_s"] > 0
    assert any("estimatedRemainingSeconds" in s for s in received.statuses[:-1])


def lightning_digits(args: list[str], url: str, pki) -> subprocess.CompletedProcess:
    """examples/lightning_digits.py (Lightning's DDP on 2 ranks) with `args`, reporting to the stand-in at `url`."""
    script = str(REPO / "examples" / "lightning_digits.py")
    environment = {**os.environ, **trainer_env(url, pki), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=environment, timeout=600)


def test_a_lightning_run_reports_its_progress_from_rank_0_too(digit_shards, pki, tmp_path):
    """examples/lightning_digits.py, Lightning's DDP on 2 ranks: the module brings the progress callback."""
    args = [*SHORT_RUN, "--mode", "resampled", "--shards", str(digit_shards), "--run-dir", str(tmp_path / "run")]
    with StatusServer(pki.cert, pki.key, TOKEN) as server:
        result = lightning_digits(args, server.url, pki)
    assert result.returncode == 0, result.stderr[-3000:]
    received = server.received
    assert received.problems == []
    percentages = received.percentages()
    # Rising (an epoch's last step may post its 50 before the epoch's end posts it again); rank 0 alone: a
    # second poster would post 100 at the end too.
    assert len(set(percentages)) >= 3 and percentages == sorted(percentages), percentages
    assert percentages[-1] == 100 and percentages.count(100) == 1 and percentages[0] < 50 <= percentages[-2]
    metrics = {m["name"]: float(m["value"]) for m in received.statuses[-1]["metrics"]}
    last = json.loads(result.stdout.strip().splitlines()[-1])  # rank 0's last validation, as the script prints it
    assert metrics["epoch"] == 1 and metrics["top1"] == pytest.approx(last["top1"], rel=1e-5)
    assert metrics["val_loss"] == pytest.approx(last["val_loss"], rel=1e-5)
    assert metrics["loss"] > 0 and metrics["img_per_s"] > 0


def test_a_lightning_run_stopped_early_ends_at_100_posted_once(digit_shards, pki, tmp_path):
    """Lightning's EarlyStopping ends the 2-epoch run after its first (any top-1 exceeds 0): a fit that ended well
    is done, so rank 0 posts 100 once more after that epoch's 50, with that epoch's metrics."""
    args = [*SHORT_RUN, "--mode", "resampled", "--shards", str(digit_shards), "--run-dir", str(tmp_path / "run")]
    with StatusServer(pki.cert, pki.key, TOKEN) as server:
        result = lightning_digits([*args, "--stop-at-top1", "0"], server.url, pki)
    assert result.returncode == 0, result.stderr[-3000:]
    last = json.loads(result.stdout.strip().splitlines()[-1])  # rank 0's last validation, as the script prints it
    assert last["epoch"] == 0  # stopped early: the schedule's last epoch (1) never ran
    received = server.received
    assert received.problems == []
    percentages = received.percentages()
    # The epoch's 50 may be replaced by the 100 before it goes out (the poster keeps the newest), so only "below".
    assert len(percentages) >= 2 and percentages == sorted(percentages), percentages
    assert percentages[-1] == 100 and percentages.count(100) == 1 and percentages[-2] <= 50, percentages
    final = received.statuses[-1]
    assert final["estimatedRemainingSeconds"] == 0
    metrics = {m["name"]: float(m["value"]) for m in final["metrics"]}
    assert metrics["epoch"] == 0 and metrics["top1"] == pytest.approx(last["top1"], rel=1e-5)
    assert metrics["val_loss"] == pytest.approx(last["val_loss"], rel=1e-5) and metrics["img_per_s"] > 0


def test_a_lightning_run_stopped_by_sigterm_exits_143_and_never_posts_100(digit_shards, pki, tmp_path):
    """Lightning ends a fit that SIGTERM stopped with a bare SystemExit, status 0: a success to a Job or TrainJob.
    The example exits 128 + 15 as `train` does, in one line, and the TrainJob's progress never reads 100."""
    script = str(REPO / "examples" / "lightning_digits.py")
    args = [*SMALL_TRAIN, "--epochs", "40", "--epoch-batches", "8", "--mode", "resampled"]
    args += ["--shards", str(digit_shards), "--run-dir", str(tmp_path / "run")]
    with StatusServer(pki.cert, pki.key, TOKEN) as server:
        environment = {**os.environ, **trainer_env(server.url, pki), "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen(
            [sys.executable, script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
        )
        deadline = time.monotonic() + 300
        while not server.received.percentages() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # until rank 0 has posted after a step: the fit is under way
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 143, (stdout[-2000:], stderr[-4000:])
    assert "lightning_digits: stopped by SIGTERM (pre-empted)" in stderr and "Traceback" not in stderr, stderr[-4000:]
    percentages = server.received.percentages()
    assert percentages and max(percentages) < 100, percentages


def test_a_lightning_run_stopped_inside_the_optimizer_step_exits_143_in_one_line(digit_shards, tmp_path):
    """SIGTERM while rank 0 is inside `optimizer.step` (a pre-hook holds it there): the stop waits for the batch's
    end, where every rank agrees on it, and the run leaves as a stop anywhere else does; no traceback."""
    driver = str(REPO / "tests" / "integration" / "lightning_stop_driver.py")
    marker = tmp_path / "inside-the-step"
    args = [*SMALL_TRAIN, "--epochs", "40", "--epoch-batches", "8", "--mode", "resampled"]
    args += ["--shards", str(digit_shards), "--run-dir", str(tmp_path / "run")]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "STOP_MARKER": str(marker)}
    environment = {name: value for name, value in environment.items() if name != URL_VAR}
    process = subprocess.Popen(
        [sys.executable, driver, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
    )
    deadline = time.monotonic() + 300
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # well inside the 4 s the hook holds rank 0 in the step
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=300)
    assert marker.exists(), stderr[-4000:]
    assert process.returncode == 143, (stdout[-2000:], stderr[-4000:])
    assert "lightning_digits: stopped by SIGTERM (pre-empted)" in stderr and "Traceback" not in stderr, stderr[-4000:]


def test_a_failing_endpoint_leaves_a_ddp_run_alone_and_is_logged_once(digit_shards, pki, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    with StatusServer(pki.cert, pki.key, TOKEN, fail_with=500) as server:
        for name, value in trainer_env(server.url, pki).items():
            monkeypatch.setenv(name, value)
        # One short epoch: its first step's report and its last both fail; the warning comes once.
        args = [*SMALL_TRAIN, "--epochs", "1", "--epoch-batches", "4"]
        result = torchrun([*args, "--shards", str(digit_shards), "--run-dir", str(run_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert [m["epoch"] for m in read_metrics(run_dir)] == [0]
    assert server.attempts >= 2
    assert result.stderr.count("trainer status: cannot report progress") == 1, result.stderr[-3000:]
    assert "HTTP 500" in result.stderr


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Unanswering:
    """A TCP server that accepts and never answers (a hung status server)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


SCHEDULE = SimpleNamespace(total=400, interval=200, epochs=2, global_batch=64)


@pytest.mark.parametrize("failure", ["down", "http 500", "other CA", "hung"])
def test_a_failing_endpoint_never_holds_up_a_step_and_warns_once(failure, pki, caplog):
    caplog.set_level(logging.WARNING, logger="imagenet_train.training.progress")
    hung = Unanswering() if failure == "hung" else None
    cert, key = (pki.other_cert, pki.other_key) if failure == "other CA" else (pki.cert, pki.key)
    with StatusServer(cert, key, TOKEN, fail_with=500 if failure == "http 500" else 0) as server:
        url = {
            "down": f"https://127.0.0.1:{closed_port()}/x",
            "hung": f"https://127.0.0.1:{hung and hung.sock.getsockname()[1]}/x",
        }
        run = progress.RunProgress.of(SCHEDULE, True, trainer_env(url.get(failure, server.url), pki))
        slowest = 0.0
        for epoch in range(2):
            hook = run.at(epoch)
            for step in range(1, 201):
                started = time.perf_counter()
                hook.after_step(step)
                slowest = max(slowest, time.perf_counter() - started)
                run.last_post -= 1.0  # as if a second went by per step: a report is due every 5 steps
            started = time.perf_counter()
            run.epoch_end(epoch, {"epoch": epoch, "train_loss": 2.0, "samples_per_s": 100.0})
            ended = time.perf_counter() - started
        assert server.received.statuses == []
    if hung:
        hung.close()
    assert slowest < 0.05, f"a step waited {slowest:.3f}s on the status endpoint"
    assert ended <= progress.FINAL_WAIT_S + 0.5  # the run's end waits for its last report, boundedly
    complaints = [r for r in caplog.records if "cannot report progress" in r.getMessage()]
    assert len(complaints) == 1, [r.getMessage() for r in caplog.records]
    assert run.poster.failed >= 1 and run.poster.sent == 0


def test_every_status_body_fits_the_crd_even_from_extreme_figures():
    extreme = status_body(250, 1e12, {"loss": float("nan"), "top1": 0.5, "x" * 80: 1e300}, time.time())
    assert body_problems(extreme) == []
    assert extreme["trainerStatus"]["progressPercentage"] == 100
    assert extreme["trainerStatus"]["estimatedRemainingSeconds"] == 2**31 - 1
    assert [m["name"] for m in extreme["trainerStatus"]["metrics"]] == ["top1", "x" * 64]
    assert body_problems(status_body(-5, float("inf"), {}, time.time())) == []
    # The stand-in refuses what the API server would: the checks above can fail.
    assert body_problems({"trainerStatus": {"progressPercentage": 5}})  # CEL: lastUpdatedTime required
    bad = {**extreme["trainerStatus"], "progressPercentage": 101, "estimatedRemainingSeconds": 2**31}
    assert len(body_problems({"trainerStatus": bad})) == 2
