"""The planner's verdicts: its per-rank batches equal what the real loaders give (simulated in this process),
and the classic failure cases are flagged before launch. The `plan` command itself: test_plan_command.py."""

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagenet_train.config import Config
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.loading.simulate import simulate
from imagenet_train.planning import plan
from imagenet_train.planning.plan_table import format_assessment
from imagenet_train.planning.queue_claims import equal_pace_claims, queue_first_shard

from conftest import write_shard


def write_shards(folder, sizes) -> list[str]:
    """Tiny shards of `sizes` samples each (keys only matter: the simulation does not decode)."""
    urls = []
    for number, size in enumerate(sizes):
        path = folder / f"s-{number:04d}.tar"
        write_shard(path, {f"k{number:04d}_{i:04d}": {"cls": b"0"} for i in range(size)})
        urls.append(str(path))
    return urls


@given(
    sizes=st.lists(st.integers(0, 25), min_size=1, max_size=9),
    nodes=st.integers(1, 3),
    gpus=st.integers(1, 3),
    workers=st.integers(0, 4),
    batch=st.integers(1, 9),
    mode=st.sampled_from(["split", "resampled", "queue"]),
    epoch=st.integers(0, 2),
    cut=st.integers(0, 6),
    repeat=st.integers(1, 2),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_planned_batches_equal_what_the_real_loaders_give(
    tmp_path_factory, sizes, nodes, gpus, workers, batch, mode, epoch, cut, repeat
):
    if mode == "resampled" and 0 in sizes:
        # Drawn with replacement, empty shards come in runs of random length, which the loader stops on: the
        # planner warns instead of counting batches (test_warns_of_empty_shards_in_resampled_mode).
        sizes = [size or 1 for size in sizes]
    urls = write_shards(tmp_path_factory.mktemp("shards"), sizes)
    if mode != "split":
        cut, repeat = (3 if mode == "resampled" else 0), 1
    setup = plan.Setup(tuple(sizes), nodes, gpus, workers, batch, mode, epoch=epoch, epoch_batches=cut, repeat=repeat)
    assessment = plan.assess(setup)
    simulated = simulate(urls, setup)
    # Queue shares follow rank speed; the plan is what each rank gets when every worker reads at the same pace,
    # as the simulation's workers do.
    assert [r.batches for r in assessment.ranks] == [s.batches for s in simulated]
    if mode == "resampled":
        assert len({s.batches for s in simulated}) == 1  # every rank the same, always
    elif cut == 0 and repeat == 1:
        assert sum(s.samples for s in simulated) == sum(sizes)  # every sample exactly once
        opened = Counter(url for s in simulated for worker in s.opened for url in worker)
        assert opened == Counter(urls)  # every shard opened exactly once over all ranks and workers


@pytest.mark.unit
def test_flags_unequal_batches_without_join_as_a_hang():
    setup = plan.Setup((100,) * 10, nodes=1, gpus_per_node=4, workers=2, batch_size=32, mode="split", join=False)
    assessment = plan.assess(setup)
    assert assessment.verdict.startswith("WILL HANG: ranks get")
    assert "stop every rank at" in assessment.fix


@pytest.mark.unit
def test_flags_fewer_shards_than_ranks_and_idle_workers():
    assessment = plan.assess(plan.Setup((100,) * 3, nodes=1, gpus_per_node=4, workers=8, batch_size=16, mode="split"))
    assert assessment.verdict.startswith("WARN: 1 of 4 ranks get no shard")
    assert any("fewer shards than --workers" in note for note in assessment.notes)


@pytest.mark.unit
def test_flags_an_epoch_longer_than_the_data():
    assessment = plan.assess(plan.Setup((100,) * 4, gpus_per_node=2, batch_size=50, epoch_batches=10))
    assert assessment.verdict.startswith("WARN: an epoch draws 1000 samples from 400")
    assert assessment.fix == "--epoch-batches 4 for one pass over the data"
    assert plan.assess(plan.Setup((100,) * 4, gpus_per_node=2, batch_size=50)).verdict == "OK"


@pytest.mark.unit
@pytest.mark.parametrize("mode", ["resampled", "split", "queue"])
def test_the_plan_table_names_the_mode_by_its_flag_word(mode):
    table = format_assessment(plan.assess(plan.Setup((64,) * 4, workers=1, batch_size=16, mode=mode)))
    assert table.splitlines()[0].endswith(f"; mode {mode}")
    assert f"{plan.Verdict.HANG}" == "WILL HANG"


@pytest.mark.unit
@pytest.mark.parametrize("mode", ["split", "resampled"])
def test_single_rank_plans_are_ok(mode):
    assert plan.assess(plan.Setup((64,) * 4, workers=2, batch_size=16, mode=mode)).verdict == "OK"


@pytest.mark.unit
def test_queue_mode_plan_and_its_hang_without_join():
    setup = plan.Setup((100,) * 8, gpus_per_node=2, workers=2, batch_size=32, mode="queue")
    assert plan.assess(setup).verdict == "OK"
    assert plan.assess(
        plan.Setup((100,) * 8, gpus_per_node=2, workers=2, batch_size=32, mode="queue", join=False)
    ).verdict.startswith("WILL HANG")
    few_shards = plan.Setup((100,) * 3, gpus_per_node=2, workers=2, batch_size=32, mode="queue")
    assert plan.assess(few_shards).verdict.startswith("WARN: 3 shards for 4 workers")


@pytest.mark.unit
def test_flags_a_fixed_epoch_longer_than_the_data_and_suggests_repeat():
    setup = plan.Setup(
        (100,) * 10, gpus_per_node=4, workers=2, batch_size=32, mode="split", epoch_batches=10, join=False
    )
    assessment = plan.assess(setup)
    assert assessment.verdict.startswith("WILL HANG: 2 ranks run out before --epoch-batches 10")
    assert assessment.fix == "--epoch-batches 8 or --repeat 2"
    fixed = plan.assess(
        plan.Setup(
            (100,) * 10, gpus_per_node=4, workers=2, batch_size=32, mode="split", epoch_batches=10, repeat=2, join=False
        )
    )
    assert fixed.verdict == "OK" and [r.batches for r in fixed.ranks] == [10] * 4


@pytest.mark.unit
def test_warns_of_empty_shards_in_resampled_mode():
    assessment = plan.assess(plan.Setup((1, 0, 0), gpus_per_node=1, batch_size=1, epoch_batches=3))
    assert assessment.verdict.startswith("WARN: 2 of 3 shards are empty")
    assert "drop the empty shards" in assessment.fix


DIGITS = (130,) * 11 + (8,)  # the digits demo's training shards: 1,438 samples


@pytest.mark.unit
@pytest.mark.parametrize("mode", ["queue", "split"])
def test_a_global_batch_larger_than_the_data_is_refused_with_a_batch_that_fits(mode):
    refused = plan.assess(plan.Setup(DIGITS, gpus_per_node=2, workers=2, batch_size=4096, mode=mode))
    assert refused.verdict == (
        "REFUSED: --batch-size 4096 on 2 ranks is a global batch of 8192, more than the 1438 samples of an epoch: "
        "every step would be a partial batch, with the LR scaled for 8192"
    )
    assert refused.fix == "--batch-size 719 or lower" and refused.fails and not refused.hangs
    assert plan.assess(plan.Setup(DIGITS, gpus_per_node=2, workers=2, batch_size=719, mode=mode)).level is not (
        plan.Verdict.REFUSE
    )


@pytest.mark.unit
def test_the_pre_flight_refuses_a_batch_larger_than_the_data_in_one_line_even_with_force():
    cfg = Config()
    cfg.loader.mode, cfg.loader.batch_size, cfg.loader.workers, cfg.run.force = "queue", 4096, 2, True
    with pytest.raises(ImagenetTrainError) as caught:
        plan.preflight_check(cfg, DIGITS, world=2)
    message = str(caught.value)
    assert message.startswith("pre-flight: REFUSED: --batch-size 4096 on 2 ranks is a global batch of 8192")
    assert message.endswith("; --batch-size 719 or lower") and "\n" not in message and "--force" not in message


@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    gpus=st.integers(1, 8),
    workers=st.integers(0, 4),
    batch=st.integers(1, 64),
    mode=st.sampled_from(["split", "queue"]),
    repeat=st.integers(1, 3),
)
@settings(max_examples=300, deadline=None)
def test_exact_modes_refuse_exactly_the_batches_an_epoch_cannot_fill_and_the_fix_fits(
    sizes, gpus, workers, batch, mode, repeat
):
    setup = plan.Setup(tuple(sizes), gpus_per_node=gpus, workers=workers, batch_size=batch, mode=mode, repeat=repeat)
    read = sum(sizes) * (repeat if mode == "split" else 1)  # queue mode reads every shard once whatever --repeat says
    assessment = plan.assess(setup)
    assert (assessment.level is plan.Verdict.REFUSE) == (read < batch * gpus)
    if assessment.level is plan.Verdict.REFUSE and read >= gpus:
        fitted = int(assessment.fix.split()[1])
        assert fitted == read // gpus
        assert plan.assess(plan.Setup(**{**setup.__dict__, "batch_size": fitted})).level is not plan.Verdict.REFUSE


@given(
    sizes=st.lists(st.integers(0, 500), min_size=1, max_size=40),
    world=st.integers(1, 6),
    workers=st.integers(0, 5),
    epoch=st.integers(0, 3),
)
@settings(max_examples=200, deadline=None)
def test_queue_claims_at_an_equal_pace_give_every_shard_once_and_every_worker_its_first(sizes, world, workers, epoch):
    order = plan.epoch_order(len(sizes), 0, epoch)
    claims = equal_pace_claims(order, sizes, world, workers)
    read = [shard for rank in claims for worker in rank for shard in worker]
    assert sorted(read) == list(range(len(sizes)))
    for rank in range(world):
        for worker in range(max(workers, 1)):
            first = queue_first_shard(rank, world, worker, max(workers, 1))
            assert claims[rank][worker][:1] == ([order[first]] if first < len(order) else [])
