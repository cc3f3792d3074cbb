"""The planner's verdicts: its per-rank batches equal what the real loaders give (simulated in this process),
and the classic failure cases are flagged before launch. The `plan` command itself: test_plan_command.py."""

import io
import tarfile
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagenet_train.loading.simulate import simulate
from imagenet_train.planning import plan


def write_shards(folder, sizes) -> list[str]:
    """Tiny shards of `sizes` samples each (keys only matter: the simulation does not decode)."""
    urls = []
    for number, size in enumerate(sizes):
        path = folder / f"s-{number:04d}.tar"
        with tarfile.open(path, "w") as archive:
            for i in range(size):
                info = tarfile.TarInfo(f"k{number:04d}_{i:04d}.cls")
                info.size = 1
                archive.addfile(info, io.BytesIO(b"0"))
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
    if mode != "queue":  # queue shares follow rank speed; what is promised is every sample once
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
    table = plan.format_assessment(plan.assess(plan.Setup((64,) * 4, workers=1, batch_size=16, mode=mode)))
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
    assert plan.assess(plan.Setup((100,) * 3, gpus_per_node=2, workers=2, mode="queue")).verdict.startswith("WARN")


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
