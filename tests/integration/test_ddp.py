"""Real `torchrun --nproc_per_node=2` training (gloo, CPU) on shards served by a real nginx."""

import json
import re
from collections import Counter

from imagenet_train.datasets.source import load_index
from imagenet_train.planning import plan

from conftest import SMALL_TRAIN, read_metrics, torchrun

SMALL = [*SMALL_TRAIN, "--log-keys"]


def keys(run_dir, split, epoch):
    found = Counter()
    for rank in range(2):
        found.update((run_dir / "keys" / f"{split}-epoch{epoch:04d}-rank{rank}.txt").read_text().split())
    return found


def test_resampled_ranks_get_equal_batches_over_nginx(shard_server, digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    result = torchrun(
        [
            *("--shards", f"{shard_server.url}/shards.json", "--run-dir", str(run_dir), "--epochs", "2"),
            *("--clip-grad-norm", "1.0", *SMALL),
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = read_metrics(run_dir)
    expected = plan.resampled_epoch_batches(1438, 32, 2)
    assert [m["epoch"] for m in metrics] == [0, 1]
    for m in metrics:
        assert m["batches_per_rank"] == [expected, expected]
        assert m["train_samples"] == expected * 64
        assert m["replicas_in_sync"] is True
    val = keys(run_dir, "val", 1)
    assert len(val) == 359 and set(val.values()) == {1}  # every val sample evaluated exactly once
    assert metrics[-1]["val_samples"] == 359
    config = json.loads((run_dir / "config.json").read_text())
    assert config["derived"]["world_size"] == 2 and config["loader"]["mode"] == "resampled"
    assert config["optim"]["clip_grad_norm"] == 1.0  # clipped steps keep the replicas in sync (checked above)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["epoch-0000.pt", "epoch-0001.pt"]
    assert "run directory:" in result.stdout


def test_split_mode_with_uneven_shards_sees_every_sample_once_and_never_hangs(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    result = torchrun(
        ["--shards", str(digit_shards), "--mode", "split", "--run-dir", str(run_dir), "--epochs", "2", *SMALL],
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = read_metrics(run_dir)
    sizes = load_index(str(digit_shards)).sizes("train")
    assert len(set(sizes)) > 1  # uneven shards
    unequal = False
    for m in metrics:
        epoch = m["epoch"]
        seen = keys(run_dir, "train", epoch)
        assert len(seen) == 1438 and set(seen.values()) == {1}
        setup = plan.Setup(tuple(sizes), gpus_per_node=2, workers=2, batch_size=32, mode="split", epoch=epoch)
        predicted = [r.batches for r in plan.rank_plans(setup)]
        assert m["batches_per_rank"] == predicted
        unequal |= len(set(predicted)) > 1
        assert m["replicas_in_sync"] is True  # Join + optimizer-state sync kept the replicas identical
    assert unequal, "the test needs an epoch where ranks get different batch counts"


def test_resume_continues_the_epoch_count_and_the_metrics(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    # A warmup of 0.2 epochs (288 of the digits' 1,438 samples) peaks in the first 5-step epoch (320 samples);
    # one epoch of warmup would outlast all three, and the LR only rise.
    args = ["--shards", str(digit_shards), "--run-dir", str(run_dir), "--epoch-batches", "5", "--warmup-epochs", "0.2"]
    args += SMALL
    first = torchrun([*args, "--epochs", "1"])
    assert first.returncode == 0, first.stderr[-3000:]
    second = torchrun([*args, "--epochs", "3", "--resume", "latest"])
    assert second.returncode == 0, second.stderr[-3000:]
    assert "continuing at epoch 1" in second.stdout
    metrics = read_metrics(run_dir)
    assert [m["epoch"] for m in metrics] == [0, 1, 2]
    assert metrics[1]["lr"] < metrics[0]["lr"]  # the schedule went on where it stopped
    assert (run_dir / "checkpoints" / "epoch-0002.pt").exists()


def last_progress(stderr: str, epoch: int) -> str:
    """Rank 0's progress bar for `epoch` as tqdm last drew it (each redraw starts with a carriage return)."""
    drawn = [line for line in re.split(r"[\r\n]", stderr) if line.startswith(f"epoch {epoch}: ")]
    assert drawn, stderr[-3000:]
    return drawn[-1]


def test_queue_mode_hands_out_uneven_shards_at_run_time_each_sample_once_and_counts_progress_without_a_total(
    digit_shards, tmp_path
):
    run_dir = tmp_path / "run"
    result = torchrun(
        ["--shards", str(digit_shards), "--mode", "queue", "--run-dir", str(run_dir), "--epochs", "2", *SMALL],
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for m in read_metrics(run_dir):
        seen = keys(run_dir, "train", m["epoch"])
        assert len(seen) == 1438 and set(seen.values()) == {1}
        assert m["train_samples"] == 1438 and m["replicas_in_sync"] is True
        # A rank's batches follow the shards its workers claim, so the bar counts them without a total (it showed
        # 16 of a total of 13, or ended at 10/13), and ends at the batches rank 0 really ran.
        ran = len(
            (run_dir / "position" / f"epoch-{m['epoch']:04d}" / "rank-0000-from-000000.keys").read_text().splitlines()
        )
        assert re.match(rf"epoch {m['epoch']}: {ran}batch \[", last_progress(result.stderr, m["epoch"])), result.stderr[
            -3000:
        ]


def test_training_by_samples_seen_gives_equal_batches_per_interval(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    # A warmup of 0.1 epochs is 144 of the run's 1,000 samples (counted in samples seen, not in intervals).
    args = ["--total-samples", "1000", "--epoch-batches", "10", "--eval-every", "2", "--warmup-epochs", "0.1"]
    # The last --batch-size wins: 16 per rank, a global batch of 32.
    result = torchrun(["--shards", str(digit_shards), "--run-dir", str(run_dir), *args, *SMALL, "--batch-size", "16"])
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = read_metrics(run_dir)
    # 1000 samples in global batches of 32: 31 steps, in intervals of 10 (the last one shorter).
    assert [m["batches_per_rank"] for m in metrics] == [[10, 10], [10, 10], [10, 10], [1, 1]]
    assert [m["samples_seen"] for m in metrics] == [320, 640, 960, 992]
    assert metrics[-1]["lr"] < 0.01 * metrics[0]["lr"]  # the cosine schedule ran its course in samples
    assert "top1" in metrics[1] and "top1" in metrics[3] and "top1" not in metrics[0]
    assert json.loads((run_dir / "config.json").read_text())["derived"]["warmup_epochs"] == 0.1


def test_split_mode_cut_at_a_fixed_epoch_length_with_repeat_gives_every_rank_the_same_batches(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    # The classic simdist fix: ranks hold 23-24 batches per pass; 30 per epoch needs the shards read twice.
    args = ["--mode", "split", "--epoch-batches", "30", "--repeat", "2", "--epochs", "1", "--eval-every", "5"]
    result = torchrun(["--shards", str(digit_shards), "--run-dir", str(run_dir), *args, *SMALL])
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_metrics(run_dir)[0]["batches_per_rank"] == [30, 30]
    refused = torchrun(
        [
            "--shards",
            str(digit_shards),
            "--run-dir",
            str(tmp_path / "r2"),
            "--mode",
            "split",
            "--epoch-batches",
            "30",
            "--epochs",
            "1",
            *SMALL,
        ]
    )
    assert refused.returncode == 0  # under Join a short rank is only a warning, never a hang
    assert "pre-flight: WARN: 2 ranks run out before --epoch-batches 30" in refused.stderr
