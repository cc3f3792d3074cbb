"""bench/'s pure page helpers: a regenerated docs/benchmarks.md keeps hand-written sections, and the per-core
table turns each configuration's rate into cores against the GPU's rate."""

from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import pages  # noqa: E402
import percore_table  # noqa: E402

pytestmark = pytest.mark.unit

PAGE = """# Benchmarks

| | measure |

## Per-image cost (bare loops, one core)

generated text

## P1/P2 with issue 21's input checks, before and after

written by a person

```bash
## P6 on a GPU: a comment in a fenced block, not a heading
```

## P6 on a GPU

generated too
"""


def test_hand_written_sections_are_kept_and_generated_ones_are_not() -> None:
    kept = pages.hand_written(PAGE, ["## Per-image cost", "## P6 on a GPU"])
    assert kept == [
        "## P1/P2 with issue 21's input checks, before and after",
        "",
        "written by a person",
        "",
        "```bash",
        "## P6 on a GPU: a comment in a fenced block, not a heading",
        "```",
        "",
    ]


def test_a_page_without_sections_keeps_nothing() -> None:
    assert pages.hand_written("", ["## P6 on a GPU"]) == []
    assert pages.hand_written("# Benchmarks\n\n| P1 | x |\n", ["## P6 on a GPU"]) == []


def results(rate: float) -> dict:
    """bench/percore.py's results with every configuration at `rate` img/s, over three rounds."""
    order = percore_table.configurations(["simplejpeg", "fused"])
    runs = {percore_table.key(*c): [rate * 0.9, rate, rate * 1.2] for c in order}
    return {
        "rounds": 3,
        "seconds": 1.5,
        "batch": 32,
        "decoders": ["simplejpeg", "fused"],
        "sample_kb": {kind: 100.0 for kind in percore_table.KINDS},
        "runs": runs,
        "median": {name: rate for name in runs},
        "wall": {name: [v / 2 for v in values] for name, values in runs.items()},
        "receive_ms": 0.05,
        "round_loads": [1.0, 2.0, 3.0, 4.0],
        "setup_s": 10,
        "measure_s": 100,
        "date": "2026-11-24",
    }


def test_cores_column_divides_the_gpu_rate_by_the_rate_per_core() -> None:
    lines = percore_table.block(results(395.0), "a CPU, 2 cores", ceiling=3949.0)
    rows = [line for line in lines if line.startswith("| 160 px") or line.startswith("| 224 px")]
    assert len(rows) == 2 * len(percore_table.KINDS) * 2
    assert rows[0].split(" | ")[1:] == [
        percore_table.KINDS["full"],
        "simplejpeg",
        "**395**",
        "356, 395, 474",
        "-10%/+20%",
        "10.0 |",
    ]
    assert "cores to feed 3,949 img/s" in "\n".join(lines)


def test_the_page_says_the_low_resolution_gpu_rate_was_not_measured() -> None:
    text = "\n".join(percore_table.block(results(100.0), "a CPU, 2 cores"))
    assert "rate at 160 and 192 px was not measured here" in text
    assert "FFCV reports 1.5-2x" in text and "their figure, not ours" in text


def test_no_rate_needs_unbounded_cores() -> None:
    assert percore_table.cores_to_feed(3949.0, 0.0) == float("inf")
    assert percore_table.cores_to_feed(3949.0, 3949.0) == 1.0


def test_reading_scales_the_low_resolution_cores_by_the_anchors_speed_up() -> None:
    text = "\n".join(percore_table.reading(results(395.0), ceiling=3949.0))
    assert "needs 10.0 cores at 224 px" in text
    assert "15.0-20.0 cores from full-size shards" in text
    assert "fused decoder is slower than simplejpeg in 0 of 12 rows" in text
