"""The pure epoch/shard/batch arithmetic the loaders and the loop share."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.planning import plan

pytestmark = pytest.mark.unit


@given(
    nshards=st.integers(1, 60),
    world=st.integers(1, 8),
    workers=st.integers(1, 6),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
)
@settings(max_examples=200, deadline=None)
def test_split_assigns_every_shard_to_exactly_one_rank_and_worker(nshards, world, workers, seed, epoch):
    order = plan.epoch_order(nshards, seed, epoch)
    seen = []
    for rank in range(world):
        mine = plan.assigned(order, rank, world)
        nworkers = max(1, plan.loader_workers(len(mine), workers))
        for worker in range(nworkers):
            seen += plan.worker_shards(order, rank, world, worker, nworkers)
    assert sorted(seen) == list(range(nshards))


@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=40),
    world=st.integers(1, 6),
    workers=st.integers(0, 4),
    batch=st.integers(1, 64),
)
@settings(max_examples=200, deadline=None)
def test_split_epoch_counts_every_sample_once_and_batches_per_worker(sizes, world, workers, batch):
    ranks = plan.rank_plans(
        plan.Setup(tuple(sizes), gpus_per_node=world, workers=workers, batch_size=batch, mode="split")
    )
    assert sum(r.samples for r in ranks) == sum(sizes)
    for r in ranks:
        # A lone leftover sample joins a worker's last full batch, so a batch holds up to batch + 1 samples.
        assert math.ceil(r.samples / (batch + 1)) <= r.batches <= math.ceil(r.samples / batch) + max(r.workers, 1) - 1


@pytest.mark.parametrize(("samples", "expected"), [(0, (0, 0)), (1, (0, 1)), (16, (1, 0)), (17, (1, 0)), (18, (1, 1))])
def test_a_lone_leftover_sample_joins_the_last_full_batch(samples, expected):
    from imagenet_train.loading.batching import batched

    assert plan.batches_for(samples, 16) == expected
    sizes = [len(batch) for batch in batched(range(samples), 16, partial=True, collate_fn=list)]
    assert len(sizes) == sum(expected) and sum(sizes) == samples and (samples < 2 or min(sizes) > 1)


@given(st.integers(0, 500), st.integers(2, 64))
@settings(max_examples=300, deadline=None)
def test_a_worker_tail_is_never_a_batch_below_half_the_batch_size(samples, batch):
    # A worker's last batch of a few samples trained on BatchNorm statistics of those few: the digits demo in
    # queue mode fell from top-1 0.98 to 0.91, through epochs at chance (batching.batched's docstring).
    from imagenet_train.loading.batching import batched

    made = list(batched(range(samples), batch, partial=True, collate_fn=list))
    assert sorted(i for b in made for i in b) == list(range(samples))  # every sample once, in one batch
    assert len(made) == sum(plan.batches_for(samples, batch))  # the planner's count holds
    assert all(len(b) <= batch + 1 for b in made)
    if samples >= batch:
        assert min(len(b) for b in made) >= batch // 2


@given(st.integers(0, 500), st.integers(2, 64))
@settings(max_examples=300, deadline=None)
def test_batches_known_to_be_followed_leave_at_once_and_are_the_same_batches(samples, batch):
    from imagenet_train.loading.batching import batched

    taken: list[int] = []

    def counted():
        for sample in range(samples):
            taken.append(sample)
            yield sample

    held = list(batched(range(samples), batch, partial=True, collate_fn=list))
    for under in (1, batch, 3 * batch):  # an index bound below what comes (a resumed epoch's skipped keys)
        assert list(batched(range(samples), batch, True, list, at_most=samples - under)) == held
    early = []
    for made in batched(counted(), batch, partial=True, collate_fn=list, at_most=samples):
        early.append(made)
        if len(early) == 1 and samples >= 3 * batch:
            # The first batch left as soon as it was full, not when the second one was (a cold epoch's wait).
            assert len(taken) == batch
    assert early == held


@given(st.integers(0, 300), st.integers(2, 32), st.integers(0, 100))
@settings(max_examples=300, deadline=None)
def test_an_index_that_counts_more_samples_than_come_makes_no_batch_of_one(samples, batch, overcount):
    # Corrupt samples (or a lying index) leave fewer samples than the index counts. Every sample still comes once,
    # except a lone leftover after a batch left early: a batch of one ends a step in BatchNorm (1x1 maps).
    from imagenet_train.loading.batching import batched

    made = list(batched(range(samples), batch, partial=True, collate_fn=list, at_most=samples + overcount))
    if overcount <= batch:  # up to a batch of corrupt samples: the same batches as holding every one
        assert made == list(batched(range(samples), batch, partial=True, collate_fn=list))
    came = sorted(i for b in made for i in b)
    assert came == list(range(samples)) or (came == list(range(samples - 1)) and samples % batch == 1)
    assert all(len(b) <= batch + 1 for b in made)
    assert samples < 2 or min(len(b) for b in made) > 1


def test_the_index_bound_takes_each_skipped_key_off_once_per_read_of_its_shard():
    from imagenet_train.loading.batching import index_bound

    sizes = {"a": 100, "b": 100}
    assert index_bound(["a", "b"], sizes, 40) == 160
    assert index_bound(["a", "b", "a", "b"], sizes, 40) == 320  # --repeat 2: a skipped key is left out twice
    assert index_bound(["a", "c"], sizes, 0) is None  # a shard the index does not count
    assert index_bound([], sizes, 5) == -5  # nothing to read: never leaves a batch early


def test_without_a_tail_to_keep_no_batch_is_held():
    from imagenet_train.loading.batching import batched

    taken: list[int] = []

    def counted():
        for sample in range(100):
            taken.append(sample)
            yield sample

    first = next(batched(counted(), 10, partial=False, collate_fn=list))
    assert first == list(range(10)) and len(taken) == 10


def test_epoch_order_is_shared_by_ranks_and_changes_between_epochs():
    assert plan.epoch_order(50, seed=1, epoch=3) == plan.epoch_order(50, seed=1, epoch=3)
    assert plan.epoch_order(50, seed=1, epoch=3) != plan.epoch_order(50, seed=1, epoch=4)
    assert sorted(plan.epoch_order(50, 1, 4)) == list(range(50))


def test_loader_workers_never_exceed_shards():
    assert plan.loader_workers(3, 8) == 3
    assert plan.loader_workers(0, 8) == 0
    assert plan.loader_workers(20, 8) == 8


def test_resampled_epoch_is_one_pass_over_the_data_per_global_batch():
    assert plan.resampled_epoch_batches(1_281_167, 256, 16) == 312
    with pytest.raises(ImagenetTrainError, match="cannot fill one batch"):
        plan.resampled_epoch_batches(100, 64, 2)


@given(
    nshards=st.integers(1, 60),
    world=st.integers(1, 8),
    reps=st.integers(2, 6),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
)
@settings(max_examples=200, deadline=None)
def test_repeated_augmentation_reads_a_share_of_the_shards_reps_times_spread_over_ranks(
    nshards, world, reps, seed, epoch
):
    # torchvision's RASampler at the shard level: a fresh 1/reps share each epoch, each shard reps times (the
    # last one fewer when reps does not divide the count), the epoch as long as one pass, copies on distinct ranks.
    order = plan.repeated_order(plan.epoch_order(nshards, seed, epoch), reps)
    assert len(order) == nshards
    chosen = sorted(set(order))
    assert len(chosen) == math.ceil(nshards / reps)
    counts = [order.count(shard) for shard in chosen]
    assert counts.count(reps) >= len(chosen) - 1 and all(1 <= count <= reps for count in counts)
    for rank_a in range(world):
        for rank_b in range(rank_a + 1, world):
            if reps <= world:  # as RASampler: each rank gets at most one copy of a shard when reps <= ranks
                shared = set(plan.assigned(order, rank_a, world)) & set(plan.assigned(order, rank_b, world))
                assert all(order.count(s) > 1 for s in shared)
    for rank in range(world):  # as RASampler: a shard's copies go to distinct ranks while reps <= ranks
        mine = plan.assigned(order, rank, world)
        assert reps > world or len(mine) == len(set(mine))


def test_repeated_augmentation_draws_a_fresh_share_every_epoch():
    shares = [frozenset(plan.repeated_order(plan.epoch_order(40, 0, epoch), 4)) for epoch in range(4)]
    assert len(set(shares)) == 4 and all(len(share) == 10 for share in shares)
    assert plan.repeated_order([3, 1, 2], 1) == [3, 1, 2]  # off: the epoch's order as it was
