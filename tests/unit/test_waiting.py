"""The program's one wait, without signals: a deadline ends a sleep with its one-line error, a sleep with
neither deadline nor stop lasts its time. (Signals: tests/integration/test_waiting.py.)"""

from __future__ import annotations

import time

import pytest

from imagenet_train import waiting
from imagenet_train.errors import ImagenetTrainError

pytestmark = pytest.mark.unit


def test_a_deadline_ends_a_longer_sleep_with_its_message():
    started = time.monotonic()
    with (
        pytest.raises(ImagenetTrainError, match="the probe ran out of time"),
        waiting.deadline(0.2, "the probe ran out of time"),
    ):
        waiting.sleep(10)
    assert time.monotonic() - started < 1.0


def test_a_sleep_without_deadline_or_stop_lasts_its_time():
    started = time.monotonic()
    waiting.sleep(0.15)
    assert 0.15 <= time.monotonic() - started < 1.0


def test_an_inner_deadline_never_extends_an_outer_one():
    with waiting.deadline(0.5, "outer"):
        with waiting.deadline(60, "inner"):
            assert waiting.left(100) <= 0.5
        assert waiting.left(100) <= 0.5
    assert waiting.left(100) == 100
