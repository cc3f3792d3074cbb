"""--grad-accum-steps over 2 real gloo ranks (torchrun): in split mode, where ranks get uneven batch counts under
Join and DDP's sync is skipped on the accumulating batches, the run ends, reads every sample once and keeps the
replicas identical."""

import json
from collections import Counter

from conftest import SMALL_TRAIN, read_metrics, torchrun


def test_accumulation_in_split_mode_with_uneven_ranks_keeps_replicas_in_sync(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    result = torchrun(
        [
            *("--shards", str(digit_shards), "--mode", "split", "--run-dir", str(run_dir), "--epochs", "2"),
            *("--grad-accum-steps", "3", "--log-keys", *SMALL_TRAIN),
        ],
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = read_metrics(run_dir)
    assert any(len(set(m["batches_per_rank"])) > 1 for m in metrics), "needs an epoch with uneven ranks"
    for m in metrics:
        seen = Counter()
        for rank in range(2):
            seen.update((run_dir / "keys" / f"train-epoch{m['epoch']:04d}-rank{rank}.txt").read_text().split())
        assert len(seen) == 1438 and set(seen.values()) == {1}
        assert m["replicas_in_sync"] is True
    derived = json.loads((run_dir / "config.json").read_text())["derived"]
    assert (derived["global_batch"], derived["optimizer_batch"]) == (64, 192)
