"""RunProgress's report of the whole run as rank 0 posts it: 100% exactly once, at the last epoch's end or when
a run that ended well stopped before it, with the last finished epoch's metrics."""

from types import SimpleNamespace

import pytest

from imagenet_train.training.progress import RunProgress

pytestmark = pytest.mark.unit

SCHEDULE = SimpleNamespace(total=400, interval=200, epochs=2, global_batch=64)


class Recorder:
    """A Poster that keeps every status it is given, posted at once."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def submit(self, body: dict) -> None:
        self.bodies.append(body["trainerStatus"])

    def drain(self, timeout: float) -> bool:
        return True

    def percentages(self) -> list[int]:
        return [status["progressPercentage"] for status in self.bodies]


def run_with_recorder() -> tuple[RunProgress, Recorder]:
    recorder = Recorder()
    return RunProgress(SCHEDULE, recorder), recorder


def metrics(status: dict) -> dict[str, float]:
    return {m["name"]: float(m["value"]) for m in status["metrics"]}


def test_a_run_ended_before_its_last_epoch_posts_100_with_that_epochs_metrics():
    run, recorder = run_with_recorder()
    run.at(0).after_step(1)
    run.epoch_end(0, {"epoch": 0, "train_loss": 1.5, "top1": 0.25, "val_loss": 1.75, "samples_per_s": 320.0})
    assert recorder.percentages() == [0, 50]
    run.end()
    assert recorder.percentages() == [0, 50, 100]
    final = recorder.bodies[-1]
    assert final["estimatedRemainingSeconds"] == 0
    assert metrics(final) == {"epoch": 0, "loss": 1.5, "top1": 0.25, "val_loss": 1.75, "img_per_s": 320.0}
    assert metrics(final) == metrics(recorder.bodies[-2])  # what the epoch's end posted


def test_a_run_that_reached_its_last_epoch_posts_100_once_though_it_ends_again():
    run, recorder = run_with_recorder()
    for epoch in range(2):
        run.epoch_end(epoch, {"epoch": epoch, "train_loss": 1.0, "samples_per_s": 100.0})
    run.end()
    run.end()
    assert recorder.percentages() == [50, 100]
    assert metrics(recorder.bodies[-1])["epoch"] == 1


def test_a_run_that_ends_before_any_epoch_ended_still_posts_100_without_metrics():
    run, recorder = run_with_recorder()
    run.at(0).after_step(3)
    run.end()
    assert recorder.percentages() == [0, 100]
    assert "metrics" not in recorder.bodies[-1]
