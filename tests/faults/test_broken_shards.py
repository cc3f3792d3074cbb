"""nginx serving a damaged copy of the shards: one truncated mid-member, or one JPEG overwritten inside
a valid tar. The samples before the damage count, the rest of the shard is skipped, counted and named."""

from __future__ import annotations

import shutil

import pytest

from imagenet_train.ops.serve import NginxServer
from imagenet_train.planning import plan

from .injectors import corrupt_jpeg_in_shard, train_keys, truncate_shard
from .runs import (
    FAULT_TRAIN,
    Row,
    account_exact,
    account_resampled,
    logged_train_keys,
    metrics,
    outcome_of,
    run_to_end,
    traceback_in,
    wall_lost,
)

DAMAGED = "imagenet-train-train-000001.tar"


def train_from_damaged(shards, tmp_path, mode: str, baselines):
    """Train once from nginx serving `shards`; returns (exit code, output, run seconds, baseline seconds)."""
    run_dir = tmp_path / "run"
    args = ["--mode", mode, *FAULT_TRAIN]
    with NginxServer(str(shards)) as server:
        run = run_to_end(
            ["--shards", f"{server.url}/shards.json", "--run-dir", str(run_dir), *args], tmp_path / "a.log", 600
        )
    return run, baselines.over_nginx(f"four-{mode}", shards.parent / "clean", args)


def damaged_copy(four_shards, tmp_path):
    """The four-shard set copied (index included, nsamples kept), next to an undamaged copy for the baseline."""
    shutil.copytree(four_shards, tmp_path / "clean")
    return shutil.copytree(four_shards, tmp_path / "damaged")


def check_truncated(four_shards, tmp_path, mode: str, record, baselines) -> None:
    shards = damaged_copy(four_shards, tmp_path)
    everything = train_keys(shards)
    cut_off = truncate_shard(shards / DAMAGED, keep_samples=50)
    run, baseline = train_from_damaged(shards, tmp_path, mode, baselines)
    text = run.output()
    code = run.process.returncode
    records = metrics(tmp_path / "run")
    keys = logged_train_keys(tmp_path / "run")
    if mode == "resampled":
        accounting = account_resampled(keys, plan.resampled_epoch_batches(len(everything), 16, 2) * 32)
    else:
        accounting = account_exact(keys, everything, broken_lost=len(cut_off))
    record(
        Row(
            fault=f"nginx serves a shard truncated mid-member ({len(cut_off)} of 130 samples cut off)",
            mode=mode,
            outcome=outcome_of(code, text),
            lost=accounting.lost,
            repeated=accounting.repeated,
            broken_lost=records[-1].get("lost_samples") if records else None,
            wall_lost_s=wall_lost(run.seconds, baseline),
            seconds=round(run.seconds, 1),
        )
    )
    assert code == 0, f"a truncated shard stopped the run:\n{text[-4000:]}"
    assert not traceback_in(text)
    warnings = [line for line in text.splitlines() if "broken shard" in line and DAMAGED in line]
    assert warnings, "no warning naming the broken shard"
    assert records[-1]["broken_shards"] >= 1
    if mode == "resampled":
        # Shards are drawn at random: the broken one may be read more than once, each read counted.
        assert records[-1]["lost_samples"] % len(cut_off) == 0 and records[-1]["lost_samples"] > 0
        assert accounting.lost == 0, accounting  # the epoch still has its nominal length
    else:
        assert records[-1]["broken_shards"] == 1 and records[-1]["lost_samples"] == len(cut_off)
        # Every sample once, except exactly what the broken shard held past the cut.
        assert everything - set(keys) == set(cut_off)
        assert accounting.repeated == 0 and accounting.unexpected == 0, accounting
        assert records[-1]["train_samples"] == len(everything) - len(cut_off)


@pytest.mark.timeout(600)
def test_split_run_skips_the_rest_of_a_truncated_shard_and_counts_it(four_shards, tmp_path, record, baselines):
    check_truncated(four_shards, tmp_path, "split", record, baselines)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["resampled", "queue"])
def test_run_skips_the_rest_of_a_truncated_shard_and_counts_it(four_shards, tmp_path, record, baselines, mode):
    check_truncated(four_shards, tmp_path, mode, record, baselines)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_split_run_skips_a_corrupt_jpeg_inside_a_valid_shard(four_shards, tmp_path, record, baselines):
    shards = damaged_copy(four_shards, tmp_path)
    everything = train_keys(shards)
    broken_key = corrupt_jpeg_in_shard(shards / DAMAGED, sample=10)
    run, baseline = train_from_damaged(shards, tmp_path, "split", baselines)
    text, code = run.output(), run.process.returncode
    records = metrics(tmp_path / "run")
    keys = logged_train_keys(tmp_path / "run")
    accounting = account_exact(keys, everything)
    record(
        Row(
            fault="nginx serves a shard with one corrupt JPEG (tar intact)",
            mode="split",
            outcome=outcome_of(code, text),
            lost=accounting.lost,
            repeated=accounting.repeated,
            broken_lost=records[-1].get("corrupt_samples") if records else None,
            wall_lost_s=wall_lost(run.seconds, baseline),
            seconds=round(run.seconds, 1),
            notes=["lost = the corrupt sample itself (skipped, counted as corrupt_samples)"],
        )
    )
    assert code == 0, text[-4000:]
    assert not traceback_in(text)
    assert records[-1]["corrupt_samples"] == 1 and records[-1]["train_samples"] == len(everything) - 1
    # The undecodable sample is the only one missing (read, but skipped before the batch).
    assert everything - set(keys) == {broken_key} and accounting.repeated == 0
