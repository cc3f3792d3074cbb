"""--model-ema: the average's closed form, its warmup copy, its decay adjustment, its exact resume through the
run state, and the final weights taken from the better of the two."""

from __future__ import annotations

import pytest
import torch

from imagenet_train import weights_files
from imagenet_train.cli import build_parser
from imagenet_train.commands.train_cmd import _config_from
from imagenet_train.config import Config
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.main.evaluate import ema_weights
from imagenet_train.planning.position import Position
from imagenet_train.planning.schedule import Schedule
from imagenet_train.rundir import checkpoint
from imagenet_train.training.evaluation import write_final
from imagenet_train.training.step import ModelEma, ema_scores, run_ema, update_decay

from conftest import REPO

pytestmark = pytest.mark.unit


class Tiny(torch.nn.Module):
    """One weight and one buffer, both set by hand between steps."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(2))
        self.register_buffer("running", torch.zeros(2))


def _set(model: Tiny, value: float) -> None:
    with torch.no_grad():
        model.weight.fill_(value)
        model.running.fill_(-value)


def test_ema_equals_the_closed_form_after_n_steps():
    model, decay = Tiny(), 0.75
    ema = ModelEma(model, decay, every=3, warmup=0).at(0)
    for step in range(1, 10):  # the weights after step s are s; updates after steps 3, 6, 9
        _set(model, step)
        ema.after_step(step)
    first = 3.0  # the first update copies the weights
    second = decay * first + (1 - decay) * 6
    third = decay * second + (1 - decay) * 9
    assert ema.module.weight.tolist() == pytest.approx([third, third])
    assert ema.module.running.tolist() == pytest.approx([-third, -third])  # buffers (BN statistics) averaged too
    assert int(ema.averaged.n_averaged) == 3


def test_ema_copies_the_weights_during_lr_warmup():
    model = Tiny()
    ema = ModelEma(model, 0.5, every=1, warmup=12).at(10)  # this epoch starts at the run's step 10
    for step in range(1, 5):  # run steps 11..14: 11 and 12 are warmup
        _set(model, step)
        ema.after_step(step)
        if step <= 3:  # each warmup update copies, and so does the first after it (as torchvision's reset does)
            assert ema.module.weight.tolist() == [step, step]
    assert ema.module.weight.tolist() == pytest.approx([0.5 * 3 + 0.5 * 4] * 2)  # then it averages


def test_ema_decay_is_adjusted_for_the_global_batch_the_interval_and_the_epochs():
    assert update_decay(0.99998, 1024, 32, 600) == pytest.approx(1 - 2e-5 * 1024 * 32 / 600)
    assert update_decay(0.9, 1024, 32, 1) == 0.0  # capped: each update copies


def test_with_accumulation_the_ema_updates_once_per_optimizer_step_the_epochs_short_last_group_included():
    model = Tiny()
    ema = ModelEma(model, 0.5, every=2, warmup=0, accumulate=3).at(0, steps=10)
    updated = []
    for step in range(1, 11):  # optimizer steps end after loader steps 3, 6, 9 and the short group's 10
        _set(model, step)
        before = int(ema.averaged.n_averaged)
        ema.after_step(step)
        if int(ema.averaged.n_averaged) > before:
            updated.append(step)
    assert updated == [6, 10]  # every 2nd optimizer step: the 2nd (after step 6) and the 4th (after step 10)
    assert ema.module.weight.tolist() == [0.5 * 6 + 0.5 * 10] * 2


def test_ema_decay_with_accumulation_counts_the_samples_of_each_optimizer_step():
    # torchvision's adjustment: (1 - decay) x samples per update / epochs, an update per --model-ema-steps optimizer
    # steps of global batch x accumulation samples: 4 x 256 x 8 x 32 samples over 90 epochs here.
    assert update_decay(0.99998, 4 * 256 * 8, 32, 90) == pytest.approx(1 - 2e-5 * 4 * 256 * 8 * 32 / 90)
    cfg = Config()
    cfg.loader.batch_size, cfg.run.epochs, cfg.optim.model_ema, cfg.optim.model_ema_steps = 64, 90, True, 4
    plain = Schedule.of(cfg, 51_200, None, 4)
    cfg.optim.grad_accum_steps = 8
    accumulated = Schedule.of(cfg, 51_200, None, 4)
    decays = []
    for schedule in (plain, accumulated):
        ema = run_ema(Tiny(), cfg.optim, schedule)
        assert ema is not None and ema.accumulate == schedule.accumulate
        decays.append(update_decay(cfg.optim.model_ema_decay, schedule.optimizer_batch, 4, 90))
        model = Tiny()
        ema.model = model
        ema.averaged.update_parameters(model)  # copies the weights (0)
        _set(model, 1.0)
        ema.averaged.update_parameters(model)  # moves the average 1 - decay towards 1
        assert float(ema.module.weight[0]) == pytest.approx(1 - decays[-1])
    # Eight times the samples per update: eight times the step towards the weights (1 - decay), so the average
    # spans the same data epochs with and without accumulation.
    assert (1 - decays[1]) == pytest.approx(8 * (1 - decays[0]))


IMAGENET_TRAIN = 1_281_167


def _recipe_run(*flags: str) -> tuple[Config, Schedule]:
    """rn50-torchvision-v2 on 8 ranks with `flags` after the recipe, as `train --config` reads it."""
    recipe = REPO / "recipes" / "rn50-torchvision-v2.yaml"
    args = build_parser().parse_args(["train", "--shards", "x", "--config", str(recipe), *flags])
    cfg = _config_from(args).for_world(8)
    return cfg, Schedule.of(cfg, IMAGENET_TRAIN, [1000] * 1281 + [167], 8)


def _span(flags: tuple[str, ...]) -> float:
    """The EMA's span (samples per update / (1 - decay per update)), in data epochs."""
    cfg, schedule = _recipe_run(*flags)
    model = Tiny()
    ema = run_ema(model, cfg.optim, schedule)
    assert ema is not None
    ema.averaged.update_parameters(model)  # the first update copies the weights (0)
    _set(model, 1.0)
    ema.averaged.update_parameters(model)  # the second moves the average 1 - decay towards them
    decay = 1 - float(ema.module.weight[0])
    samples_per_update = schedule.optimizer_batch * cfg.optim.model_ema_steps
    return samples_per_update / (1 - decay) / IMAGENET_TRAIN


@pytest.mark.parametrize(
    ("flags", "run_epochs", "span"),
    [
        ((), 600, 23.4),  # the anchor's command: 600 passes, an average over the last 23.4 of them
        (("--mode", "resampled", "--epochs", "600", "--epoch-batches", "300"), 143.9, 5.6),  # loop epochs of 300 steps
        (("--mode", "resampled", "--total-samples", str(600 * IMAGENET_TRAIN), "--epoch-batches", "300"), 600, 23.4),
        (("--mode", "split", "--epochs", "600", "--epoch-batches", "300"), 143.9, 5.6),  # every rank cut at 300
        (
            (
                "--grad-accum-steps",
                "4",
            ),
            600,
            23.4,
        ),  # the recipe's 1,024 per optimizer step: 32 per rank, 4 times
    ],
)
def test_ema_horizon_counts_data_epochs_whatever_the_loop_epochs_are(flags, run_epochs, span):
    # torchvision's adjustment makes the average span a fixed share of the run (1 / ((1 - decay) x samples) of it,
    # 3.9% for this recipe), counted in passes over the data; loop epochs of another length must not change it.
    found = _span(flags)
    # (before: 23.4 for the second, 97.7 for the third: the decay was adjusted for 600 and 2,503 loop epochs)
    assert found == pytest.approx(span, abs=0.05)
    assert found / run_epochs == pytest.approx(1 / (2e-5 * IMAGENET_TRAIN), rel=2e-3)


def _train(model, optimizer, ema, steps: range) -> None:
    """Steps on fixed data (the same batch for the same step), the EMA hook after each."""
    for step in steps:
        generator = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 4, generator=generator), torch.randint(0, 3, (8,), generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        ema.after_step(step + 1)


def _parts(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer, ModelEma(model, 0.8, every=2, warmup=1)


def _state(run_dir, model, optimizer) -> checkpoint.RunState:
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return checkpoint.RunState(run_dir, {"model": model, "optimizer": optimizer, "scaler": scaler}, {})


def test_ema_resumed_mid_epoch_continues_exactly_as_the_uninterrupted_run(tmp_path):
    model, optimizer, ema = _parts()
    _train(model, optimizer, ema.at(0), range(10))
    expected = {key: value.clone() for key, value in ema.state_dict().items()}

    model, optimizer, ema = _parts()
    state = _state(tmp_path, model, optimizer)
    state.add("ema", ema)
    _train(model, optimizer, ema.at(0), range(5))
    path = state.write(-1, Position(0, 5, [0], 1))

    model, optimizer, ema = _parts(seed=1)  # other initial weights: everything must come from the checkpoint
    state = _state(tmp_path, model, optimizer)
    state.add("ema", ema)
    assert state.restore(path)[0] == 0
    _train(model, optimizer, ema.at(0), range(5, 10))
    got = ema.state_dict()
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


def test_a_checkpoint_without_ema_resumes_into_a_run_with_ema(tmp_path):
    model, optimizer, _ = _parts()
    path = _state(tmp_path, model, optimizer).write(0)
    model, optimizer, ema = _parts(seed=1)
    state = _state(tmp_path, model, optimizer)
    state.add("ema", ema)
    assert state.restore(path) == (1, None)
    _train(model, optimizer, ema.at(0), range(2))  # the average starts from the resumed weights
    assert int(ema.averaged.n_averaged) == 1
    assert "ema" in checkpoint.load(state.write(1))


def _final_file(tmp_path):
    """What RunDirectory.write_final does, in tmp_path."""

    def save(state):
        checkpoint.save(state, tmp_path / "final.pt")
        return tmp_path / "final.pt"

    return save


def test_final_weights_come_from_the_better_top1(tmp_path):
    model, optimizer, ema = _parts()
    _train(model, optimizer, ema.at(0), range(6))
    record = {"top1": 0.5, "top5": 0.9, "val_loss": 1.0, **ema_scores({"top1": 0.6, "top5": 0.9, "val_loss": 1.1})}
    assert write_final(_final_file(tmp_path), model, ema, record) == "ema"
    final = weights_files.load_weights(tmp_path / "final.pt")
    assert all(torch.equal(final[key], value) for key, value in ema.module.state_dict().items())
    assert not torch.equal(final["0.weight"], model.state_dict()["0.weight"])
    record["ema_top1"] = 0.4
    assert write_final(_final_file(tmp_path), model, ema, record) == "raw"
    final = weights_files.load_weights(tmp_path / "final.pt")
    assert all(torch.equal(final[key], value) for key, value in model.state_dict().items())


def test_ema_weights_come_out_of_a_checkpoint_as_the_model_s_state_dict(tmp_path):
    model, optimizer, ema = _parts()
    _train(model, optimizer, ema.at(0), range(4))
    state = _state(tmp_path, model, optimizer)
    without = state.write(0)
    with pytest.raises(ImagenetTrainError, match="--ema: .* holds no EMA weights"):
        ema_weights(without)
    state.add("ema", ema)
    weights = ema_weights(state.write(1))
    fresh = _parts(seed=3)[0]
    fresh.load_state_dict(weights)  # strict: exactly the model's keys
    assert torch.equal(fresh[0].weight, ema.module[0].weight)
