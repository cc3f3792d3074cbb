"""Where an epoch starts, from a checkpoint's position: the pure decision the trainer applies to its loader."""

import pytest

from imagenet_train.choices import Mode
from imagenet_train.planning.position import Position
from imagenet_train.planning.resume import EpochStart, epoch_start

pytestmark = pytest.mark.unit

# 2 ranks of batch 16 saved at step 12 of epoch 3, when the epoch still owed 320 samples.
SAVED = Position(3, 12, [0, 5], world=2, samples_left=320)


@pytest.mark.parametrize("mode", list(Mode))
def test_without_a_checkpoint_of_this_epoch_it_starts_at_its_beginning(mode):
    for saved in (None, Position(2, 7, [0], world=2)):
        start = epoch_start(saved, 3, mode, 2, 16, epoch_batches=30)
        assert start.position == Position(3) and start.resumed_from is None
        assert not start.skip_consumed and start.resume_tag == "" and not start.world_changed
        assert start.batches == (30 if mode == Mode.RESAMPLED else None)


def test_a_split_epoch_cut_at_epoch_batches_ends_there_for_every_rank():
    assert epoch_start(None, 0, Mode.SPLIT, 2, 16, 30, split_cut=25).batches == 25
    assert epoch_start(SAVED, 3, Mode.SPLIT, 2, 16, 30, split_cut=25).batches == 25 - 12
    assert epoch_start(SAVED, 3, Mode.QUEUE, 2, 16, 30, split_cut=25).batches is None  # queue mode is never cut


def test_resampled_resumes_with_the_batches_left_and_fresh_draws():
    start = epoch_start(SAVED, 3, Mode.RESAMPLED, 2, 16, epoch_batches=30)
    assert start == EpochStart(Position(3, 12, [0, 5, 12]), 18, SAVED, resume_tag=":resume12")


def test_resampled_on_another_world_owes_the_samples_left_not_the_steps_left():
    start = epoch_start(SAVED, 3, Mode.RESAMPLED, 4, 16, epoch_batches=15)
    assert start.world_changed and start.batches == 320 // (16 * 4)


@pytest.mark.parametrize("mode", [Mode.SPLIT, Mode.QUEUE])
@pytest.mark.parametrize("world", [2, 3])
def test_exact_modes_skip_what_the_position_consumed_and_open_a_segment(mode, world):
    start = epoch_start(SAVED, 3, mode, world, 16, epoch_batches=30)
    assert start.skip_consumed and start.resumed_from == SAVED and start.resume_tag == ""
    assert start.position == Position(3, 12, [0, 5, 12])
    assert start.world_changed == (world != 2)


def test_a_position_saved_before_its_first_step_is_kept_as_it_is():
    stopped_early = Position(3, 0, [0], world=2, samples_left=480)
    start = epoch_start(stopped_early, 3, Mode.SPLIT, 2, 16, epoch_batches=30)
    assert start.position is stopped_early and not start.skip_consumed
