"""--grad-accum-steps: k loader batches per optimizer step, the loss divided by the group's size, DDP's gradient
sync skipped on all but the group's last batch, and the LR and its scaling counted in optimizer steps."""

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from imagenet_train.config import Config
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.planning.schedule import Accumulation, Schedule
from imagenet_train.training.step import CompiledForward, TrainStep

pytestmark = pytest.mark.unit


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 3))


def _step(model: torch.nn.Module, wrapper: torch.nn.Module | None = None, forward=None) -> TrainStep:
    """The step as step.build makes it: `forward` what it calls (the wrapper, or the wrapper compiled)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    loss = torch.nn.CrossEntropyLoss()
    return TrainStep(model, forward or wrapper or model, optimizer, loss, None, False, wrapper=wrapper)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (8, 3, 4, 4), dtype=torch.uint8, generator=generator)
    return images, torch.tensor([0, 1, 2, 0, 1, 2, 2, 1])


def test_two_accumulated_half_batches_step_as_one_whole_batch():
    images, labels = _batch()
    whole = _model()
    _step(whole)(images, labels)
    halves = _model()
    step, before = _step(halves), [p.detach().clone() for p in halves.parameters()]
    step(images[:4], labels[:4], Accumulation(2, True, False))
    assert all(torch.equal(a, b) for a, b in zip(before, halves.parameters(), strict=True))  # no step yet
    step(images[4:], labels[4:], Accumulation(2, False, True))
    for a, b in zip(whole.parameters(), halves.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_the_next_group_starts_from_cleared_gradients():
    images, labels = _batch()
    twice, fresh = _model(), _model()
    step = _step(twice)
    step(images[:4], labels[:4], Accumulation(1, True, True))
    step(images[4:], labels[4:], Accumulation(1, True, True))
    reference = _step(fresh)
    reference(images[:4], labels[:4])
    reference(images[4:], labels[4:])
    for a, b in zip(twice.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("compiled", [False, True])
def test_ddp_syncs_gradients_only_after_the_groups_last_batch(tmp_path, compiled):
    """Also under --compile, where the step calls the compiled wrapper (an eager backend here) and DDP is inside."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = _model()
        ddp = DistributedDataParallel(model)
        syncing: list[bool] = []
        model[1].weight.register_hook(lambda grad: syncing.append(ddp.require_backward_grad_sync))
        forward = CompiledForward(ddp, batch_size=8, sizes=1, backend="eager") if compiled else None
        step = _step(model, ddp, forward)
        images, labels = _batch()
        for index in range(3):
            step(images, labels, Accumulation(3, index == 0, index == 2))
        assert syncing == [False, False, True]
    finally:
        dist.destroy_process_group()


def _schedule(accumulate: int, **optim) -> Schedule:
    cfg = Config()
    cfg.loader.batch_size, cfg.run.epochs, cfg.optim.grad_accum_steps = 32, 10, accumulate
    for key, value in optim.items():
        setattr(cfg.optim, key, value)
    return Schedule.of(cfg, train_samples=6400, train_sizes=None, world=2)


def test_the_lr_scales_with_the_optimizers_batch_and_changes_once_per_optimizer_step():
    plain, accumulated = _schedule(1), _schedule(4)
    assert accumulated.optimizer_batch == 4 * plain.global_batch == 256
    assert accumulated.base_lr == pytest.approx(4 * plain.base_lr)
    steps = accumulated.epoch_batches(0)
    assert steps == plain.epoch_batches(0) == 100  # loader batches per epoch stay one pass of the data
    rates = [accumulated.lr(0, step, steps) for step in range(8)]
    assert rates[:4] == [rates[0]] * 4 and rates[4:] == [rates[4]] * 4 and rates[4] > rates[0]
    # the warmup is one epoch: 25 optimizer steps of 256 samples each
    assert accumulated.lr(0, 96, steps) == pytest.approx(accumulated.base_lr)
    assert accumulated.lr(0, 92, steps) < accumulated.base_lr


def test_the_epochs_last_group_is_shorter_when_the_epoch_does_not_divide():
    groups = [_schedule(3).accumulation(step, 7) for step in range(7)]
    assert [g.size for g in groups] == [3, 3, 3, 3, 3, 3, 1]
    assert [g.starts for g in groups] == [True, False, False, True, False, False, True]
    assert [g.ends for g in groups] == [False, False, True, False, False, True, True]


def test_the_global_batch_is_the_optimizers_so_each_rank_takes_its_share_of_every_accumulated_step():
    # A 4,096-batch recipe on 4 ranks with 8 accumulation steps: 128 per rank per loader step, 4,096 per optimizer
    # step, and the LR scaled for 4,096 as without accumulation on 32 ranks.
    cfg = Config()
    cfg.loader.global_batch_size, cfg.optim.grad_accum_steps = 4096, 8
    accumulated = cfg.for_world(4)
    assert accumulated.loader.batch_size == 128
    schedule = Schedule.of(accumulated, train_samples=409_600, train_sizes=None, world=4)
    assert schedule.optimizer_batch == 4096 and schedule.global_batch == 512
    cfg.optim.grad_accum_steps = 1
    wide = Schedule.of(cfg.for_world(32), train_samples=409_600, train_sizes=None, world=32)
    assert wide.optimizer_batch == 4096 and schedule.base_lr == pytest.approx(wide.base_lr)
    cfg.optim.grad_accum_steps = 3
    with pytest.raises(ImagenetTrainError, match=r"^--global-batch-size: 4096 does not divide over 4 ranks x 3 --gra"):
        cfg.for_world(4)
