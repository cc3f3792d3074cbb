"""tools/dashboard_png.py draws every panel of the chart's dashboard from Prometheus' answers, legends filled in as
Grafana fills them, into a PNG small enough for the docs."""

from __future__ import annotations

import json

import dashboard_png
import pytest

pytestmark = pytest.mark.unit


def answer_for(query: str, start: float, end: float) -> list[dict]:
    """Two ranks' series, as query_range returns them."""
    return [
        {
            "metric": {"rank": rank, "node": "node-a"},
            "values": [[start + t, str(t * (1 + int(rank)))] for t in (0, 2, 4)],
        }
        for rank in ("0", "1")
    ]


def test_each_panel_query_becomes_a_line_per_series_with_its_legend_filled_in(monkeypatch) -> None:
    monkeypatch.setattr(dashboard_png, "query_range", lambda url, query, start, end: answer_for(query, start, end))
    panel = {"targets": [{"expr": "a", "legendFormat": "retries, rank {{rank}} on {{node}}"}, {"expr": "b"}]}
    lines = dashboard_png.panel_series("http://127.0.0.1:1", panel, 1000.0, 1004.0)
    assert [legend for legend, _, _ in lines] == ["retries, rank 0 on node-a", "retries, rank 1 on node-a", "", ""]
    assert lines[1][1:] == ([0.0, 2.0, 4.0], [0.0, 4.0, 8.0])  # seconds since the start, values as numbers


def test_the_whole_dashboard_draws_into_a_png_under_300_kb(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(dashboard_png, "query_range", lambda url, query, start, end: answer_for(query, start, end))
    panels = json.loads(dashboard_png.DASHBOARD.read_text())["panels"]
    series = [dashboard_png.panel_series("http://127.0.0.1:1", panel, 0.0, 4.0) for panel in panels]
    out = tmp_path / "img" / "dashboard.png"
    dashboard_png.draw(panels, series, out, "caption")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 10_000 < out.stat().st_size < 300_000
