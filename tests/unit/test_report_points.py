"""report's point reduction: a curve of many epochs becomes at most MAX_POINTS points, each record counted."""

from __future__ import annotations

import pytest

from imagenet_train.ops.report_plots import _last, reduced

pytestmark = pytest.mark.unit


def test_a_short_series_is_drawn_as_it_is():
    pairs = [(epoch, float(epoch)) for epoch in range(10)]
    assert reduced(pairs, limit=10) == ([e for e, _ in pairs], [v for _, v in pairs])


def test_a_long_series_becomes_the_means_of_runs_of_consecutive_epochs():
    pairs = [(epoch, float(epoch % 4)) for epoch in range(12)]
    assert reduced(pairs, limit=3) == ([1.5, 5.5, 9.5], [1.5, 1.5, 1.5])


def test_envelopes_keep_the_extremes_and_a_running_total_its_value_at_each_runs_end():
    pairs = [(epoch, float(value)) for epoch, value in enumerate([3, 1, 2, 9, 4, 4, 5])]
    assert reduced(pairs, min, limit=3) == ([1, 4, 6], [1, 4, 5])  # runs of 3 epochs: 0-2, 3-5, 6
    assert reduced(pairs, max, limit=3)[1] == [3, 9, 5]
    assert reduced(pairs, _last, limit=3) == ([2, 5, 6], [2, 4, 5])
