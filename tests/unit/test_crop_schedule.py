"""The train crop size of each epoch: fixed, or FFCV's progressive ramp in multiples of 32."""

import pytest

from imagenet_train.config import AugmentConfig, Config
from imagenet_train.planning.resolution import CropSchedule
from imagenet_train.planning.schedule import Schedule

pytestmark = pytest.mark.unit


def test_without_a_ramp_every_epoch_uses_the_train_crop_size():
    assert CropSchedule(176).sizes(5) == [176] * 5
    assert CropSchedule.of(AugmentConfig()).sizes(3) == [224] * 3


def test_the_ramp_holds_the_start_size_then_rises_linearly_and_holds_the_end_size():
    schedule = CropSchedule(224, start_size=128, end_size=256, start_epoch=2, end_epoch=6)
    assert schedule.sizes(9) == [128, 128, 128, 160, 192, 224, 256, 256, 256]


def test_sizes_inside_the_ramp_are_rounded_to_multiples_of_32():
    # FFCV's rn50 88-epoch recipe: 160 px until epoch 65, 192 px from epoch 76.
    schedule = CropSchedule(224, start_size=160, end_size=192, start_epoch=65, end_epoch=76)
    sizes = schedule.sizes(88)
    assert sizes[:66] == [160] * 66 and sizes[76:] == [192] * 12
    assert all(size % 32 == 0 for size in sizes[66:76])
    assert sizes[70] == 160 and sizes[71] == 192  # 174.5 -> 160, 177.5 -> 192: the nearer multiple


def test_a_ramp_between_sizes_that_are_not_multiples_of_32_stays_within_its_ends():
    sizes = CropSchedule(64, start_size=40, end_size=72, start_epoch=0, end_epoch=10).sizes(12)
    assert sizes[0] == 40 and sizes[-1] == 72 and all(40 <= size <= 72 for size in sizes)
    assert set(sizes[1:10]) <= {40, 64, 72}


def test_a_ramp_that_starts_and_ends_at_one_epoch_is_a_step():
    assert CropSchedule(224, 160, 224, 3, 3).sizes(5) == [160, 160, 160, 160, 224]  # the size steps up after epoch 3


def test_the_schedule_of_a_run_comes_from_its_progressive_settings():
    data = AugmentConfig(
        progressive_start_size=160, progressive_end_size=192, progressive_start_epoch=1, progressive_end_epoch=2
    )
    assert CropSchedule.of(data).sizes(4) == [160, 160, 192, 192]


def test_under_shorter_loop_epochs_the_ramp_counts_data_epochs_as_the_lr_does():
    # FFCV's 88-epoch ramp (160 px to epoch 65, 192 px from 76) in a run of 4x shorter loop epochs
    # (--epoch-batches at a quarter of a pass): the sizes change at the same samples seen, 4x later in loop epochs.
    cfg = Config()
    data, cfg.run.epochs, cfg.loader.batch_size, cfg.loader.epoch_batches = cfg.augment, 88 * 4, 100, 250
    data.progressive_start_size, data.progressive_end_size = 160, 192
    data.progressive_start_epoch, data.progressive_end_epoch = 65, 76
    schedule = Schedule.of(cfg, train_samples=100_000, train_sizes=None, world=1)
    assert schedule.interval_epochs == 0.25
    sizes = CropSchedule.of(data, schedule.interval_epochs).sizes(schedule.epochs)
    by_pass = CropSchedule.of(data).sizes(88)
    assert len(sizes) == 4 * 88 and sizes[::4] == by_pass  # at each pass's start, the size the pass-epoch run has
    assert set(sizes[: 4 * 65 + 1]) == {160} and set(sizes[4 * 76 :]) == {192}


def test_without_epoch_batches_a_loop_epoch_is_one_data_epoch():
    cfg = Config()
    cfg.run.epochs, cfg.loader.batch_size = 5, 64
    assert Schedule.of(cfg, train_samples=10_000, train_sizes=None, world=2).interval_epochs == 1.0


def test_a_small_image_ramp_moves_in_its_own_step_not_ffcvs_32():
    # In 32s a ramp from 14 to 28 px jumps from one end to the other after its first epoch; in 4s it climbs.
    assert CropSchedule(28, 14, 28, 0, 4).sizes(5) == [14, 28, 28, 28, 28]
    assert CropSchedule(28, 14, 28, 0, 4, step=4).sizes(5) == [14, 16, 20, 24, 28]
