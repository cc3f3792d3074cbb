"""The chart's pods run for real: the shard server and its fill, `helm test`, each launcher's training run from
nginx and from the bucket and its resume from the bucket, and a pod killed mid-run under each launcher's
rendered failure semantics. Every run writes a row of the e2e report, which tools/e2e_table.py makes docs/e2e.md of.
"""

from __future__ import annotations

import pytest
from status_server import StatusServer, make_pki

from imagenet_train.errors import RETRY_EXIT

from .controllers import StatusGate, status_audience
from .runs import NVIDIA_STANDIN, Clock, MidRun, Row, bucket_files, bucket_metrics, values

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

LAUNCHERS = ["pytorchjob", "indexedjob", "jobset", "trainjob"]


def trained(outcome) -> None:
    """Every pod of the run ended with 0, each ran NVIDIA's entrypoint first and launched torchrun."""
    assert outcome.state == "Succeeded", (outcome.reason, outcome.events)
    assert outcome.exit_codes and all(code == 0 for _, code in outcome.exit_codes), outcome.exit_codes
    for pod, log in outcome.logs:
        assert NVIDIA_STANDIN in log, f"{pod}: the image's entrypoint did not run first:\n{log[-3000:]}"
        assert "imagenet-train launch: " in log and "torchrun" in log, f"{pod}:\n{log[-3000:]}"


def resumed_line(outcome) -> str:
    """Rank 0's account of its resume: how many files came from the bucket, and where it continued."""
    for _, log in outcome.logs:
        lines = log.splitlines()
        fetched = [line for line in lines if line.startswith("fetched ") and " files from gs://" in line]
        resumed = [line for line in lines if line.startswith("resumed from /results/")]
        if resumed:
            return "; ".join([*fetched[-1:], resumed[-1]])
    return ""


@pytest.mark.parametrize("source", ["nginx", "bucket"])
@pytest.mark.parametrize("kind", LAUNCHERS)
def test_training_runs_to_the_end_and_resumes_from_the_bucket(kind, source, releases, emulator, record):
    run, release, clock = f"{kind}-{source}", releases[source], Clock()
    outcome, _ = release.train(values(kind, source, run, emulator, epochs=1))
    trained(outcome)
    assert [m["epoch"] for m in bucket_metrics(run)] == [0]
    files = bucket_files(run)
    assert {"config.json", "metrics.jsonl", "checkpoints/epoch-0000.pt"} <= set(files), files
    resumed, _ = release.train(values(kind, source, run, emulator, epochs=2))
    trained(resumed)
    line = resumed_line(resumed)
    assert "continuing at epoch 1" in line, resumed.logs
    metrics = bucket_metrics(run)
    assert [m["epoch"] for m in metrics] == [0, 1]
    record(
        Row(
            kind,
            source,
            "1 epoch, then `resume: latest` with epochs 2 in a new install",
            "finished",
            epochs="1 + 1 resumed",
            top1=metrics[-1].get("top1"),
            bucket=", ".join(sorted(name for name in bucket_files(run) if not name.startswith("tensorboard/"))),
            resumed=line,
            seconds=clock(),
            events=outcome.events + resumed.events,
        )
    )


# A pod killed or evicted early in epoch 1 of 3, and what the rendered semantics must make of it.
FAULTS = [
    # (launcher, elastic, pod, action, expected outcome, what the chart renders)
    (
        "pytorchjob",
        True,
        "worker-1",
        "kill",
        "Succeeded",
        "elastic: OnFailure restarts the container; torchrun re-forms",
    ),
    ("pytorchjob", False, "worker-0", "evict", "Succeeded", "ExitCode: every rank stops at a checkpoint, 143 retries"),
    (
        "pytorchjob",
        False,
        "worker-0",
        "kill",
        "Succeeded",
        "ExitCode: 137 and the master's 138 (a rank gone) retry; the world restarts",
    ),
    ("indexedjob", False, "1", "kill", "Succeeded", "podFailurePolicy: 137 and 138 counted (2 of 3); both replaced"),
    ("jobset", False, "node-0-1", "kill", "Succeeded", "backoffLimit 0 fails the Job; failurePolicy restarts the set"),
    ("trainjob", False, "node-0-1", "kill", "Succeeded", "runtime's JobSet: OnFailure restarts containers in place"),
]


@pytest.mark.parametrize(("kind", "elastic", "pod", "action", "expected", "semantics"), FAULTS)
def test_a_pod_lost_mid_run_recovers_or_fails_cleanly(
    kind, elastic, pod, action, expected, semantics, releases, emulator, record
):
    run, clock = f"{kind}{'-elastic' if elastic else ''}-{action}", Clock()
    fault = MidRun(run, f"ngx-imagenet-train-{pod}", action)
    release = releases["nginx"]
    outcome, controller = release.train(values(kind, "nginx", run, emulator, epochs=3, elastic=elastic), tick=fault)
    assert fault.done, "the fault never fired (the run ended before epoch 1?)"
    assert all(name.endswith("-shards-0") for name in controller.kubelet.pods), "training pods left behind"
    if outcome.state == "Failed":  # the controller itself stopped the survivors (no pod waits for a dead peer)
        assert any(event.split(" ", 1)[1].startswith("delete ") for event in outcome.events), outcome.events
    row = Row(
        f"{kind}{' (elastic)' if elastic else ''}",
        "nginx",
        f"{action} {pod} in epoch 1 of 3",
        f"{outcome.state}: {outcome.reason}",
        seconds=clock(),
        events=outcome.events,
        semantics=semantics,
        expected=expected,
    )
    if outcome.state == "Succeeded":
        metrics = bucket_metrics(run)
        row.top1, row.epochs = metrics[-1].get("top1"), f"{len(metrics)} of 3"
        row.resumed = resumed_line(outcome)
    record(row)
    assert outcome.state == expected, (semantics, outcome.reason, outcome.events)
    if action == "kill" and not elastic and kind in ("pytorchjob", "indexedjob"):
        # The survivor left on its own, with Kubeflow's retry code (errors.RETRY_EXIT), not after a timeout.
        assert any(f"exited {RETRY_EXIT}" in event for event in outcome.events), outcome.events
    if outcome.state == "Succeeded":  # every epoch's line, once: none lost to the kill, none repeated by the resume
        assert [m["epoch"] for m in bucket_metrics(run)] == [0, 1, 2]


def test_a_trainjob_with_the_trainers_status_variables_reports_progress_to_100(
    releases, emulator, cluster, tmp_path, record
):
    """Kubeflow Trainer's TrainJobStatus gate played by the harness (no real Trainer controller runs here): the
    pods get the variables and the projected volume, and a stand-in of its status server on the cluster's
    gateway checks the token and every body against the CRD's trainerStatus schema and CEL rules."""
    run, release, clock = "trainjob-status", releases["nginx"], Clock()
    name = f"{release.name}-imagenet-train"
    ca, cert, key = make_pki(tmp_path / "status", host=cluster.gateway, name="trainer")
    token = cluster.service_account_token(status_audience("default", name))
    with StatusServer(cert, key, token, host=cluster.gateway, job=name) as server:
        cluster.trainer_status = StatusGate(server.url.split("/apis/")[0], ca.read_text())
        try:
            outcome, _ = release.train(values("trainjob", "nginx", run, emulator, epochs=2))
        finally:
            cluster.trainer_status = None
    assert outcome.state == "Succeeded", (outcome.reason, [(pod, log[-3000:]) for pod, log in outcome.logs])
    trained(outcome)
    assert server.received.problems == []
    percentages = server.received.percentages()
    record(
        Row(
            "trainjob",
            "nginx",
            "2 epochs with Kubeflow Trainer's status variables (stand-in status server)",
            f"{outcome.state}: trainerStatus progressPercentage {percentages}",
            epochs="2",
            top1=bucket_metrics(run)[-1].get("top1"),
            seconds=clock(),
            events=outcome.events,
        )
    )
    assert len(percentages) >= 3 and percentages == sorted(set(percentages)), percentages
    assert percentages[-1] == 100 and server.received.statuses[-1]["estimatedRemainingSeconds"] == 0
