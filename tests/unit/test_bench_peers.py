"""bench/peers_table.py turns each round's figures into medians and per-round speed ratios pair by pair, and the
peers stay bench-only: pinned, installed apart from the venv, never in the training image."""

from __future__ import annotations

import re
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import pages  # noqa: E402
import peers_table  # noqa: E402

pytestmark = pytest.mark.unit

PEERS = ("litdata", "mosaicml-streaming")


def run(first_batch: float, epoch1: float, epoch2: float) -> dict:
    return {"first_batch_s": first_batch, "epoch1": epoch1, "epoch2": epoch2}


def results() -> dict:
    """Three rounds: ours 500/600/700 img/s in epoch 1 against MosaicML's 250/400/350, and so on."""
    local = {
        "ours": [run(2.0, 500, 900), run(3.0, 600, 950), run(2.5, 700, 800)],
        "mosaicml": [run(0.5, 250, 900), run(0.4, 400, 950), run(0.5, 350, 1000)],
        "litdata": [run(0.2, 1000, 450), run(0.3, 600, 475), run(0.25, 700, 400)],
    }
    s3 = {**local, "ours_cache": [run(1.0, 1000, 1800), run(1.5, 1200, 1900), run(1.25, 1400, 1600)]}
    return {
        "images": 2600,
        "rounds": 3,
        "workers": 2,
        "convert": {"ours": [2.0, 3.0, 4.0], "mosaicml": [6.0, 6.0, 6.0], "litdata": [4.0, 3.0, 8.0]},
        "reads": {"local": local, "s3": s3},
        "load": [6.5, 7.25],
        "versions": {"ours": "0.3.0", "mosaicml": "0.13.0", "litdata": "0.2.76"},
        "machine": "a test CPU, 2 cores",
        "date": "2026-11-28",
    }


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_a_median_of_an_even_count_is_the_mean_of_the_middle_two():
    assert peers_table.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert peers_table.median([3.0, 1.0, 2.0]) == 2.0


def test_ratios_are_taken_within_each_round_and_point_the_same_way_for_rates_and_seconds():
    assert peers_table.speed_ratios([500, 600], [250, 400], more_is_better=True) == [2.0, 1.5]
    assert peers_table.speed_ratios([2.0, 3.0], [0.5, 0.6], more_is_better=False) == pytest.approx([0.25, 0.2])
    # the median of per-round ratios, not the ratio of medians (500/350 here)
    assert peers_table.ratio_cell([500, 600, 700], [250, 400, 350], True) == "**2.00x** (2.00, 1.50, 2.00)"


def test_the_table_has_medians_and_each_pairs_ratio_for_every_place_and_measure():
    rows = peers_table.rows(results())
    by_title = {cells(line)[0]: cells(line)[1:] for line in rows[2:]}
    assert by_title["local disk: epoch 1, cold (caches emptied, start-up included)"] == [
        "600 img/s",
        "350 img/s",
        "700 img/s",
        "**2.00x** (2.00, 1.50, 2.00)",
        "**1.00x** (0.50, 1.00, 1.00)",
        "**0.50x** (0.25, 0.67, 0.50)",
    ]
    first = by_title["S3 (moto on 127.0.0.1): first batch of epoch 1, from making the dataset"]
    assert first[:3] == ["2.50 s", "0.50 s", "0.25 s"] and first[3] == "**0.20x** (0.25, 0.13, 0.20)"
    cached = by_title[
        "S3 (moto on 127.0.0.1): epoch 1, cold (caches emptied, start-up included), ours with --cache-dir"
    ]
    assert cached[0] == "1200 img/s" and cached[3] == "**4.00x** (4.00, 3.00, 4.00)"
    conversion = by_title["conversion of 2600 JPEGs, each with its own writer"]
    assert conversion[:4] == ["3.00 s", "6.00 s", "4.00 s", "**2.00x** (3.00, 2.00, 1.50)"]
    # conversion, then 3 measures from local disk, 3 + 3 (ours with --cache-dir) from S3
    assert len(rows) == 2 + 1 + 3 + 6


def test_the_section_names_its_command_machine_load_and_what_is_still_not_equal():
    block = "\n".join(peers_table.block(results()))
    assert block.startswith(peers_table.HEADING + "\n")
    assert "`python bench/peers.py --images 2600 --rounds 3 --workers 2`" in block
    assert "a test CPU, 2 cores" in block and "load average 6.5 at the start, 7.2 at the end" in block
    assert "MosaicML streaming 0.13.0" in block and "LitData 0.2.76" in block
    assert "sha256" in block and "page cache" in block and "cut short" not in block


def test_a_run_cut_short_says_how_many_rounds_of_those_asked_for_it_measured():
    two = results()
    two["rounds"], two["asked"] = 2, 3
    for reads in two["reads"].values():
        for name in reads:
            reads[name] = reads[name][:2]
    two["convert"] = {name: seconds[:2] for name, seconds in two["convert"].items()}
    block = "\n".join(peers_table.block(two))
    assert "--rounds 3" in block and "2 interleaved rounds (cut short: 2 of the 3 asked for)" in block


def test_the_section_replaces_its_old_self_and_keeps_the_rest_of_the_page():
    old = f"# Benchmarks\n\n| | P1 |\n\n{peers_table.HEADING}\n\nold figures\n\n## P6 on a GPU\n\nkept\n"
    new = pages.replace_section(old, peers_table.HEADING, peers_table.block(results()))
    assert "old figures" not in new and new.count(peers_table.HEADING) == 1
    assert "| | P1 |" in new and new.rstrip().endswith("kept")


def test_the_peers_are_pinned_bench_only_and_never_in_the_training_image():
    pins = [
        line.split("#")[0].strip()
        for line in (REPO / "bench" / "peers-requirements.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    names = {re.split("==", pin)[0].lower() for pin in pins}
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", pin) for pin in pins), pins
    assert set(PEERS) <= names and not names & {"torch", "torchvision", "numpy"}
    image = (REPO / "images" / "train" / "requirements.txt").read_text().lower()
    assert not [peer for peer in PEERS if peer in image]
    pyproject = (REPO / "pyproject.toml").read_text().lower()
    assert not [peer for peer in PEERS if peer in pyproject]  # no extra that would resolve them into the venv
    makefile = (REPO / "Makefile").read_text()
    assert "--no-deps --target $(PEERS) -r bench/peers-requirements.txt" in makefile
