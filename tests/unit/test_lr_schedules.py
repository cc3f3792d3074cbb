"""The LR over samples seen: each --lr-schedule's shape, warmup counted in real epochs of samples (also under
--epoch-batches and --total-samples), the auto warmup that grows with the global batch, and the large-batch advice."""

import pytest

from imagenet_train.choices import LrSchedule, Opt, WarmupMethod
from imagenet_train.cli import build_parser
from imagenet_train.commands.train_cmd import _config_from
from imagenet_train.config import Config
from imagenet_train.config_checks import checked
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.planning.schedule import LrCurve, Schedule, large_batch_advice, warmup_epochs

pytestmark = pytest.mark.unit


def curve(schedule: LrSchedule, end: float = 0.0) -> LrCurve:
    # Peak 1 after 1,000 samples of warmup, 10,000 samples in all, 100 per step; step drops every 3,000.
    return LrCurve(schedule, 1.0, warmup=1000, total=10_000, batch=100, end=end, gamma=0.1, step_every=3000)


@pytest.mark.parametrize("schedule", list(LrSchedule))
def test_every_schedule_warms_up_linearly_to_the_peak(schedule):
    lr = curve(schedule)
    assert lr.at(0) == pytest.approx(0.1)  # the first step's samples are a tenth of the warmup
    assert lr.at(400) == pytest.approx(0.5)
    assert lr.at(900) == pytest.approx(1.0)  # the warmup's last step reaches the peak
    assert lr.at(1000) == pytest.approx(1.0)  # and the schedule starts there


def test_cosine_is_half_way_down_in_the_middle_and_ends_at_lr_end():
    lr = curve(LrSchedule.COSINE, end=0.01)
    assert lr.at(5500) == pytest.approx(0.505)
    assert lr.at(10_000) == pytest.approx(0.01)
    assert 0.01 < lr.at(9900) < 0.02


def test_step_multiplies_by_gamma_every_n_epochs_of_samples():
    lr = curve(LrSchedule.STEP)
    assert [lr.at(seen) for seen in (2900, 3000, 5500, 6000, 9900)] == pytest.approx([1.0, 0.1, 0.1, 0.01, 0.001])


def test_poly_is_mlperfs_power_two_decay_to_lr_end():
    lr = curve(LrSchedule.POLY, end=0.0001)
    assert lr.at(5500) == pytest.approx(0.0001 + (1 - 0.0001) * 0.25)  # half-way: (1 - 0.5) ** 2
    assert lr.at(10_000) == pytest.approx(0.0001)
    assert lr.at(5500) < curve(LrSchedule.COSINE).at(5500)  # below cosine in the middle


def test_triangular_falls_in_a_straight_line_to_zero():
    lr = curve(LrSchedule.TRIANGULAR, end=0.5)  # --lr-end does not apply: FFCV's ramp ends at 0
    assert [lr.at(seen) for seen in (3250, 5500, 7750, 10_000)] == pytest.approx([0.75, 0.5, 0.25, 0.0])


def schedule(train_samples: int = 10_000, **changes) -> Schedule:
    cfg = Config()
    cfg.loader.batch_size, cfg.run.epochs = 32, 20
    for key, value in changes.items():
        section = next(s for s in cfg.sections() if hasattr(s, key))
        setattr(section, key, value)
    return Schedule.of(cfg, train_samples=train_samples, train_sizes=None, world=2)


def peak_step(s: Schedule) -> int:
    """The first global step at the peak LR."""
    lrs = [s.lr(e, i, s.epoch_batches(e)) for e in range(s.epochs) for i in range(s.epoch_batches(e))]
    return lrs.index(max(lrs))


@pytest.mark.parametrize("length", [{"epoch_batches": 100}, {"epoch_batches": 100, "total_samples": 200_000}])
def test_one_warmup_epoch_is_one_pass_of_samples_not_one_loader_interval(length):
    s = schedule(warmup_epochs=1.0, **length)
    assert s.interval == 100 and s.global_batch == 64
    # 10,000 samples at 64 a step: the step that takes samples seen past 10,000 is global step 156, not 99.
    assert peak_step(s) == 156
    assert s.lr(0, 99, 100) == pytest.approx(s.base_lr * 100 * 64 / 10_000)


def test_a_full_pass_epoch_warms_up_over_the_training_set_too():
    s = schedule(train_samples=1000, warmup_epochs=2.0)  # 15 steps of 64 per epoch
    assert peak_step(s) == 31  # 2,000 samples are reached during the 32nd step


@pytest.mark.parametrize(("global_batch", "epochs"), [(256, 1.0), (1024, 1.0), (4096, 2.5), (8192, 5.0), (32768, 5.0)])
def test_auto_warmup_grows_with_the_global_batch_to_goyals_five_epochs(global_batch, epochs):
    assert warmup_epochs(-1, global_batch) == pytest.approx(epochs)
    assert warmup_epochs(0.5, global_batch) == 0.5  # a declared warmup is kept


def test_the_schedule_resolves_auto_warmup_for_its_global_batch():
    s = schedule(warmup_epochs=-1, batch_size=2048)  # 2 ranks: 4,096
    assert s.warmup == pytest.approx(2.5)
    assert s.curve.warmup == pytest.approx(2.5 * 10_000)


def test_large_batch_with_plain_sgd_is_advised_lars_and_a_longer_warmup():
    advice = large_batch_advice(Opt.SGD, 16384, 1.0)
    assert "--opt lars" in advice and "16384" in advice and "warmup of 5 epochs" in advice
    assert "warmup of" not in large_batch_advice(Opt.SGD, 16384, -1)  # auto already gives 5 epochs
    assert large_batch_advice(Opt.SGD, 8192, -1) is None
    assert large_batch_advice(Opt.LARS, 32768, -1) is None
    assert large_batch_advice(Opt.LAMB, 32768, -1) is None


def test_the_schedule_advises_on_a_large_batch_and_on_a_warmup_as_long_as_the_run():
    large = schedule(batch_size=8192, train_samples=1_000_000)  # 16,384 over 2 ranks
    assert any("--opt lars" in line for line in large.advice())
    assert not schedule(batch_size=8192, train_samples=1_000_000, opt="lars").advice()
    short = schedule(epochs=1, warmup_epochs=1.0)
    assert any("LR only ever rises" in line for line in short.advice())


def test_linear_warmup_starts_at_lr_warmup_decay_of_the_peak_as_torchvisions_linearlr():
    lr = LrCurve(LrSchedule.COSINE, 1.0, warmup=1000, total=10_000, batch=100, warmup_start=0.01)
    assert lr.at(0) == pytest.approx(0.01 + 0.99 * 0.1)  # one step's worth of the ramp from 1% of the peak
    assert lr.at(400) == pytest.approx(0.01 + 0.99 * 0.5)
    assert lr.at(900) == pytest.approx(1.0)


def test_constant_warmup_holds_lr_warmup_decay_of_the_peak_then_jumps_to_it():
    lr = LrCurve(LrSchedule.COSINE, 1.0, 1000, 10_000, 100, warmup_method=WarmupMethod.CONSTANT, warmup_start=1 / 3)
    assert [lr.at(seen) for seen in (0, 500, 900)] == pytest.approx([1 / 3] * 3)
    assert lr.at(1000) == pytest.approx(1.0)


def test_the_warmup_settings_reach_the_schedule_and_constant_from_zero_is_refused():
    s = schedule(lr_warmup_method="constant", lr_warmup_decay=0.25, warmup_epochs=1.0)
    assert s.lr(0, 0, 100) == pytest.approx(0.25 * s.base_lr)
    cfg = Config()
    cfg.data.shards, cfg.optim.lr_warmup_method = "shards.json", "constant"
    with pytest.raises(ImagenetTrainError, match=r"^--lr-warmup-method constant: .*--lr-warmup-decay above 0"):
        checked(cfg)


def test_lr_min_is_torchvisions_name_for_cosines_floor():
    cfg = _config_from(build_parser().parse_args(["train", "--shards", "x", "--lr-min", "0.002"]))
    assert cfg.optim.lr_end == 0.002
    s = schedule(lr_end=0.002)
    assert s.curve.at(s.curve.total) == pytest.approx(0.002)
