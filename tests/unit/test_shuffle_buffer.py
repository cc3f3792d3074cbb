"""The loader's shuffle buffer (stages.shuffled): it starts yielding once it holds its initial part, grows to its
full size, gives every item once, and its order follows the seed alone."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

import pytest

from imagenet_train.loading.stages import shuffled

pytestmark = pytest.mark.unit


class Counted:
    """A stream of 0..n-1 that notes how many items were read when each item of the shuffle came out."""

    def __init__(self, n: int):
        self.n, self.read = n, 0

    def __iter__(self) -> Iterator[int]:
        for item in range(self.n):
            self.read += 1
            yield item


def reads_at_each_yield(n: int, buffer: int, initial: int) -> tuple[list[int], list[int]]:
    """(the shuffled items, how many items had been read as each came out)."""
    stream = Counted(n)
    out, reads = [], []
    for item in shuffled(stream, buffer, random.Random(0), initial):
        out.append(item)
        reads.append(stream.read)
    return out, reads


def test_the_first_item_leaves_once_the_initial_part_is_read_not_the_whole_buffer():
    out, reads = reads_at_each_yield(5000, 1000, 100)
    assert reads[0] == 100  # not 1001: a cold epoch's first batch no longer waits for 1,000 samples
    assert out[0] < 100  # drawn from what was read
    # A first batch of 64 needs 100 + 2 * 63 reads while the buffer grows.
    assert reads[63] == 100 + 2 * 63


def test_the_buffer_grows_to_its_full_size_and_then_yields_one_item_per_item_read():
    _, reads = reads_at_each_yield(5000, 1000, 100)
    held = [read - taken for taken, read in enumerate(reads, 1)]  # items in the buffer after each yield
    assert max(held) == 1000
    full = held.index(1000)
    # Full after 1,900 reads (one more held for every two read); the next read is one in for one out.
    assert reads[full] == 100 + 2 * 900 + 1
    assert all(h == 1000 for h in held[full : 5000 - 1000])  # then one out for one in, until the stream ends


@pytest.mark.parametrize(("n", "buffer", "initial"), [(5000, 1000, 100), (50, 1000, 100), (150, 1000, 100), (7, 3, 1)])
def test_every_item_comes_out_exactly_once(n, buffer, initial):
    out, _ = reads_at_each_yield(n, buffer, initial)
    assert Counter(out) == Counter(range(n))


def test_the_order_follows_the_seed_alone():
    def order(seed: int) -> list[int]:
        return list(shuffled(iter(range(3000)), 1000, random.Random(seed)))

    assert order(7) == order(7)
    assert order(7) != order(8)
    assert order(7) != list(range(3000))


def test_an_initial_part_as_large_as_the_buffer_waits_for_the_full_buffer():
    out, reads = reads_at_each_yield(3000, 1000, 1000)
    assert reads[0] == 1001  # the buffer's earlier rule: full first, then one out per item read
    legacy, rng = [], random.Random(0)  # that rule written out
    pool: list[int] = []
    for item in range(3000):
        if len(pool) < 1000:
            pool.append(item)
            continue
        slot = rng.randrange(len(pool))
        legacy.append(pool[slot])
        pool[slot] = item
    rng.shuffle(pool)
    assert out == [*legacy, *pool]
