"""Retries and outage seconds reach the tally a process was given (io/outage_tally.py), counted where the I/O
layer waits an outage out (io/resumable.py's Outage), so a rank's /metrics can report them."""

from __future__ import annotations

import multiprocessing

import pytest

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import outage_tally, resumable

pytestmark = pytest.mark.unit


@pytest.fixture
def tally(monkeypatch):
    """A tally this process counts into, with 50 ms between attempts; no tally again afterwards."""
    monkeypatch.setattr(resumable, "backoff", lambda attempt: 0.05)
    counted = outage_tally.OutageTally(multiprocessing.get_context("spawn"))
    outage_tally.count_into(counted)
    yield counted
    outage_tally.count_into(None)


def test_each_wait_of_an_outage_counts_one_retry_and_the_seconds_since_the_last(tally) -> None:
    outage = resumable.Outage("http://127.0.0.1:1/a.tar", budget=60)
    for _ in range(3):
        outage.wait(ConnectionRefusedError(111, "Connection refused"))
    retries, seconds = tally.snapshot()
    assert retries == 3
    assert 0.15 <= seconds < 5  # three 50 ms waits, each counted once


def test_an_outage_that_gives_up_counts_its_seconds_but_no_retry(tally) -> None:
    outage = resumable.Outage("http://127.0.0.1:1/a.tar", budget=0.08)
    outage.wait(ConnectionRefusedError(111, "Connection refused"))
    with pytest.raises(ImagenetTrainError, match="gave up at --io-timeout"):
        outage.wait(ConnectionRefusedError(111, "Connection refused"))
    retries, seconds = tally.snapshot()
    assert retries == 1
    assert seconds >= 0.05


def test_a_stall_counts_its_window_as_outage(tally) -> None:
    since = resumable.time.monotonic() - 2.0  # the slow connection's window began 2 s ago
    resumable.Outage("http://127.0.0.1:1/a.tar", budget=60, since=since).wait(resumable.Stalled("slow", since))
    assert tally.snapshot()[1] >= 2.0


def test_a_process_given_no_tally_counts_nothing(monkeypatch) -> None:
    monkeypatch.setattr(resumable, "backoff", lambda attempt: 0.01)
    elsewhere = outage_tally.OutageTally(multiprocessing.get_context("spawn"))
    outage_tally.count_into(None)
    resumable.Outage("http://127.0.0.1:1/a.tar", budget=60).wait(ConnectionResetError(104, "reset"))
    assert elsewhere.snapshot() == (0, 0.0)
