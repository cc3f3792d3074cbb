"""What the bounded node cache evicts (io/cache_space.victims) and the limit the chart derives from its volume."""

from __future__ import annotations

import random

import pytest

from imagenet_train.deployment import CACHE_SHARE, cache_limit, quantity_bytes
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.cache_space import Entry, victims

pytestmark = pytest.mark.unit


def names(chosen: list[Entry] | None) -> list[str] | None:
    return None if chosen is None else [entry.name for entry in chosen]


def test_nothing_is_evicted_while_the_new_copy_fits():
    entries = [Entry("a", 30, 1.0), Entry("b", 30, 2.0)]
    assert victims(entries, limit=100, need=40) == []


def test_the_least_recently_used_idle_copies_go_first_and_no_more_than_needed():
    entries = [Entry("new", 30, 3.0), Entry("old", 30, 1.0), Entry("mid", 30, 2.0)]
    assert names(victims(entries, limit=100, need=40)) == ["old"]
    assert names(victims(entries, limit=100, need=70)) == ["old", "mid"]


def test_a_copy_being_read_is_never_chosen_even_when_oldest():
    entries = [Entry("read", 30, 0.5, busy=True), Entry("old", 30, 1.0), Entry("new", 30, 3.0)]
    assert names(victims(entries, limit=100, need=40)) == ["old"]


def test_no_room_when_every_copy_is_in_use():
    entries = [Entry("a", 50, 1.0, busy=True), Entry("b.part", 40, 2.0, busy=True)]
    assert victims(entries, limit=100, need=20) is None


def test_a_shard_larger_than_the_limit_is_never_cached():
    assert victims([], limit=100, need=101) is None


def test_a_killed_writers_partial_copy_is_removed_even_with_room_and_a_live_one_is_kept():
    entries = [Entry(".x.abc.part", 60, 5.0), Entry(".y.def.part", 10, 1.0, busy=True), Entry("z", 10, 0.0)]
    assert names(victims(entries, limit=1000, need=10)) == [".x.abc.part"]
    assert names(victims(entries, limit=100, need=85)) == [".x.abc.part", "z"]


def test_after_eviction_the_folder_and_the_new_copy_fit_under_the_limit():
    rng = random.Random(47)
    for _ in range(2000):
        entries = [
            Entry(f"f{i}", rng.randrange(0, 50), rng.random(), busy=rng.random() < 0.3) for i in range(rng.randrange(8))
        ]
        limit, need = rng.randrange(1, 200), rng.randrange(0, 120)
        chosen = victims(entries, limit, need)
        idle = sorted((e for e in entries if not e.busy), key=lambda e: (e.mtime, e.name))
        if chosen is None:  # impossible only when even removing every idle copy leaves no room
            assert need > limit or sum(e.size for e in entries if e.busy) + need > limit
            continue
        assert not any(entry.busy for entry in chosen)
        assert chosen == idle[: len(chosen)]  # oldest first, a prefix of the LRU order
        kept = sum(e.size for e in entries) - sum(e.size for e in chosen)
        assert kept + need <= limit
        if chosen:  # one fewer would not have fit
            assert kept + chosen[-1].size + need > limit


def test_the_chart_gives_the_cache_nine_tenths_of_its_volume():
    assert quantity_bytes("500Gi", "cache.sizeLimit") == 500 * 2**30
    assert quantity_bytes("64G", "cache.sizeLimit") == 64 * 10**9
    assert quantity_bytes(1024, "cache.sizeLimit") == 1024
    assert cache_limit({"enabled": True, "sizeLimit": "100Mi"}) == int(100 * 2**20 * CACHE_SHARE)
    assert cache_limit({"enabled": False, "sizeLimit": "100Mi"}) == 0


@pytest.mark.parametrize("quantity", ["abc", "5mi", "1e", "5K", ""])
def test_a_size_limit_that_is_no_quantity_is_one_line_naming_the_field(quantity):
    with pytest.raises(ImagenetTrainError, match=r"^cache\.sizeLimit: .* is not a Kubernetes quantity"):
        quantity_bytes(quantity, "cache.sizeLimit")
