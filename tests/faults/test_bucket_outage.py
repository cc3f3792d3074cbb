"""The GCS emulator behind `--results gs://...` stopped for 60 s mid-epoch and started again with its data:
training does not stop, uploads retry in the background, and the final sync leaves the bucket complete."""

from __future__ import annotations

import pytest

from imagenet_train.io import gcs
from imagenet_train.ops.serve import NginxServer, free_port

from .injectors import RestartableEmulator, timed_outage, train_keys
from .runs import (
    FAULT_TRAIN,
    Row,
    TorchRun,
    account_exact,
    logged_train_keys,
    outcome_of,
    run_to_end,
    step_checkpoint,
    traceback_in,
    wall_lost,
)

BUCKET = "imagenet-train-faults"
OUTAGE_S = 60


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_results_mirror_survives_a_60s_bucket_outage(four_shards, tmp_path, record, baselines, monkeypatch):
    emulator = RestartableEmulator(tmp_path / "bucket-data", free_port(), BUCKET)
    emulator.up()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
    gcs.client.cache_clear()
    args = ["--mode", "split", *FAULT_TRAIN]
    run_dir = tmp_path / "run"
    try:
        with NginxServer(str(four_shards)) as server:
            shards = ["--shards", f"{server.url}/shards.json"]

            def clean(workdir) -> float:
                results = ["--results", f"gs://{BUCKET}/baseline"]
                run = run_to_end([*shards, "--run-dir", str(workdir / "run"), *results, *args], workdir / "b.log", 400)
                assert run.process.returncode == 0, run.output()[-3000:]
                return run.seconds

            baseline = baselines.of("four-split-results", clean)
            results = f"gs://{BUCKET}/run"
            run = TorchRun([*shards, "--run-dir", str(run_dir), "--results", results, *args], tmp_path / "a.log")
            run.wait_for(step_checkpoint(run_dir, 4).exists, 300, "a checkpoint at step 4")
            outage = timed_outage(emulator.down, emulator.up, OUTAGE_S)
            code = run.wait(timeout=900)
        text = run.output()
        local = {
            p.relative_to(run_dir).as_posix(): p.stat().st_size
            for p in run_dir.rglob("*")
            if p.is_file() and ".tmp" not in p.name and ".part" not in p.name
        }
        gcs.client.cache_clear()
        remote = {o.name.removeprefix("run/"): o.size for o in gcs.listing(results + "/")}
    finally:
        emulator.down()
        gcs.client.cache_clear()
    accounting = account_exact(logged_train_keys(run_dir), train_keys(four_shards))
    missing = sorted(name for name, size in local.items() if remote.get(name) != size)
    record(
        Row(
            fault=f"GCS emulator (--results gs://) stopped mid-epoch for {OUTAGE_S} s, restarted with its data",
            mode="split",
            outcome=outcome_of(code, text) + (f"; {len(missing)} files not in the bucket" if missing else ""),
            lost=accounting.lost,
            repeated=accounting.repeated,
            wall_lost_s=wall_lost(run.seconds, baseline),
            seconds=round(run.seconds, 1),
            notes=[f"bucket down {outage['down_s']:.0f} s"],
        )
    )
    assert code == 0, text[-4000:]
    assert not traceback_in(text)
    assert not missing, f"not mirrored to the bucket: {missing}"
    assert "metrics.jsonl" in remote and "checkpoints/epoch-0000.pt" in remote
    assert accounting.lost == 0 and accounting.repeated == 0, accounting
