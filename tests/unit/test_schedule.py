"""The run's schedule: epoch lengths, intervals for --total-samples, and the LR over global steps."""

import pytest

from imagenet_train.config import Config
from imagenet_train.planning.schedule import Schedule

pytestmark = pytest.mark.unit


def schedule(**changes) -> Schedule:
    cfg = Config()
    cfg.loader.batch_size, cfg.run.epochs = 16, 3
    for key, value in changes.items():
        section = next(s for s in cfg.sections() if hasattr(s, key))
        setattr(section, key, value)
    return Schedule.of(cfg, train_samples=1000, train_sizes=[300, 300, 250, 150], world=2)


def test_resampled_epochs_are_one_pass_and_the_lr_scales_with_the_global_batch():
    s = schedule()
    assert s.epoch_batches(0) == s.interval == 1000 // 32 and s.total == 3 * 31 and s.epochs == 3
    assert s.base_lr == pytest.approx(0.1 * 32 / 256)


def test_total_samples_makes_equal_intervals_with_a_short_last_one():
    s = schedule(total_samples=1000, epoch_batches=10, warmup_epochs=0.1)  # warmup: 100 of the run's 1,000 samples
    assert (s.total, s.interval, s.epochs) == (31, 10, 4)
    assert [s.epoch_batches(e) for e in range(4)] == [10, 10, 10, 1]
    assert s.lr(3, 0, 1) < s.lr(0, 9, 10)


def test_split_epoch_length_is_the_longest_rank():
    from imagenet_train.planning import plan

    s = schedule(mode="split", workers=1)
    ranks = plan.rank_plans(plan.Setup((300, 300, 250, 150), gpus_per_node=2, workers=1, batch_size=16, mode="split"))
    assert s.epoch_batches(0) == max(r.batches for r in ranks) and len({r.batches for r in ranks}) == 2


def test_lr_warms_up_then_decays_monotonically():
    s = schedule(warmup_epochs=1.0)
    lrs = [s.lr(e, i, s.interval) for e in range(3) for i in range(s.interval)]
    peak = lrs.index(max(lrs))
    assert peak == s.interval  # one epoch is 1,000 samples: the 32nd step of 32 passes it, the 31st does not
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1 :], strict=False))


def test_a_queue_epoch_is_the_longest_ranks_batches_at_an_equal_pace_and_its_progress_has_no_total():
    from imagenet_train.planning import plan

    s = schedule(mode="queue", workers=2)
    ranks = plan.rank_plans(plan.Setup((300, 300, 250, 150), gpus_per_node=2, workers=2, batch_size=16, mode="queue"))
    # One shard per worker: 300 + 250 samples are 19 + 16 batches of 16 on one rank, 300 + 150 are 19 + 10 on the other.
    assert [r.batches for r in ranks] == [35, 29] and [r.samples for r in ranks] == [550, 450]
    assert s.epoch_batches(0) == 35  # was ceil(1000 / 32) + 2 workers = 34, short of what rank 0 runs
    assert s.known_batches(0) is None  # a rank's count follows the shards its workers claim at run time
    assert schedule(mode="split", workers=1).known_batches(0) == schedule(mode="split", workers=1).epoch_batches(0)
