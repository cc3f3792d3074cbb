"""Host-side step overhead and first-batch wait per epoch on CPU, through the trainer's own epoch loop.

Runs `Trainer.train_epoch` (resampled mode, the default) and splits each step's wall time into the model's
forward (with the loss) and backward, and everything else: getting the next batch (waiting on the workers,
plus any batching in the training process), the copy and normalisation, the optimizer, and the loop's
bookkeeping (LR, loss sum, progress bar, pre-emption vote). Steps are measured from one batch's hand-over
to the next, so an epoch's start and end are left out; each epoch's start is its first-batch wait: from
calling `train_epoch` to having the first batch. Runs against whichever imagenet_train is on PYTHONPATH,
so the same script measures the code before and after a change (bench/epochs.py runs both).

  PYTHONPATH=app python bench/stepoverhead.py SHARDS [--arch resnet18 --size 32 --batch 32 --workers 2
                                                      --epochs 3 --batches 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time

import torch

from imagenet_train.config import Config

try:  # settings checked at the entry point (config_checks.checked); before, Config.validate did it all
    from imagenet_train.config_checks import checked
except ImportError:

    def checked(cfg: Config) -> Config:
        """The older trees' whole check."""
        return cfg.validate()


try:  # this tree's layout by concern
    from imagenet_train.datasets.source import resolve_source
    from imagenet_train.loading.stream import EpochLoader
    from imagenet_train.main.train import run_parts
    from imagenet_train.training.dist import DistInfo
    from imagenet_train.training.loop import Trainer
except ImportError:
    run_parts = None  # the trees before main/: the trainer built its batches and run directory itself
    try:  # the layout by concern before main/
        from imagenet_train.datasets.source import resolve_source
        from imagenet_train.loading.stream import EpochLoader
        from imagenet_train.training.dist import DistInfo
        from imagenet_train.training.loop import Trainer
    except ImportError:
        try:  # the layout by concern before the loader was split (loading/pipeline.py)
            from imagenet_train.loading.pipeline import EpochLoader, resolve_source
            from imagenet_train.training.dist import DistInfo
            from imagenet_train.training.loop import Trainer
        except ImportError:  # the flat layout of the "before" ref bench/epochs.py also measures
            from imagenet_train.data import EpochLoader, resolve_source
            from imagenet_train.dist import DistInfo
            from imagenet_train.train import Trainer


class Spans:
    """(start, end) of every call of the wrapped functions, to sum those inside a window later."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []

    def wrap(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spans.append((start, time.perf_counter()))

        return timed

    def open(self, *_) -> None:
        self.spans.append((time.perf_counter(), 0.0))

    def close(self, *_) -> None:
        self.spans[-1] = (self.spans[-1][0], time.perf_counter())

    def within(self, start: float, end: float) -> float:
        """Seconds spent in calls that began at or after `start` and ended by `end`."""
        return sum(b - a for a, b in self.spans if a >= start and 0 < b <= end)


def instrument(trainer: Trainer) -> dict[str, Spans]:
    """Time the model's forward and the loss, backward, the optimizer step and each batch hand-over."""
    spans = {name: Spans() for name in ("forward", "backward", "optimizer", "batch")}
    step = getattr(trainer, "step", None)
    parts = step if hasattr(step, "criterion") else trainer  # the step's own object, or the older Trainer's fields
    for module in (trainer.model, parts.criterion):
        module.register_forward_pre_hook(spans["forward"].open)
        module.register_forward_hook(spans["forward"].close)
    torch.Tensor.backward = spans["backward"].wrap(torch.Tensor.backward)
    parts.optimizer.step = spans["optimizer"].wrap(parts.optimizer.step)
    iterate = EpochLoader.__iter__

    def handed_over(loader):
        batches = iterate(loader)
        while True:
            start = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                return
            spans["batch"].spans.append((start, time.perf_counter()))
            yield batch

    EpochLoader.__iter__ = handed_over
    return spans


def configured(**settings: object) -> Config:
    """A Config with each setting put in whichever section of this tree holds it: the sections differ between the
    trees measured (before and after the data settings were split into data, loader and augment)."""
    cfg = Config()
    sections = [getattr(cfg, f.name) for f in dataclasses.fields(cfg)]
    for name, value in settings.items():
        setattr(next(section for section in sections if hasattr(section, name)), name, value)
    return cfg


def measure(args: argparse.Namespace) -> dict:
    """First-batch wait per epoch and the mean step split into forward, backward and the host-side rest."""
    torch.set_num_threads(1)
    cfg = configured(
        shards=args.shards,
        train_crop_size=args.size,
        val_resize_size=args.size,
        val_crop_size=args.size,  # the check refuses a val resize below the crop
        batch_size=args.batch,
        workers=args.workers,
        epoch_batches=args.batches,
        arch=args.arch,
        epochs=args.epochs,
        run_dir=tempfile.mkdtemp(prefix="bench-step-"),
    )
    cfg, info = checked(cfg), DistInfo(0, 1, 0, torch.device("cpu"))
    source = resolve_source(args.shards)
    trainer = Trainer(cfg, info, source, run_parts(cfg, info)) if run_parts else Trainer(cfg, info, source)
    spans = instrument(trainer)
    first_waits, windows = [], []
    for epoch in range(args.epochs):
        start, handed = time.perf_counter(), len(spans["batch"].spans)
        (getattr(trainer, "train_one_epoch", None) or trainer.train_epoch)(epoch)
        ends = [end for _, end in spans["batch"].spans[handed:]]
        first_waits.append(ends[0] - start)
        windows.append((ends[0], ends[-1], len(ends) - 1))  # a step per interval between hand-overs
    loaders = getattr(trainer, "batches", None) or trainer.train_loader
    close = getattr(loaders, "close", None)
    if close:
        close()
    steps = sum(n for _, _, n in windows)
    per_step = {
        name: 1e3 * sum(spans[name].within(a, b) for a, b, _ in windows) / steps
        for name in ("forward", "backward", "optimizer")
    }
    per_step["step"] = 1e3 * sum(b - a for a, b, _ in windows) / steps
    # A step's batch wait is the next batch's hand-over, which ends its interval (the first one starts it).
    per_step["batch_wait"] = 1e3 * sum(spans["batch"].within(a, b) for a, b, _ in windows) / steps
    per_step["outside"] = per_step["step"] - per_step["forward"] - per_step["backward"]
    per_step["rest"] = per_step["outside"] - per_step["batch_wait"] - per_step["optimizer"]
    return {
        "first_batch_s": [round(w, 3) for w in first_waits],
        "steps": steps,
        **{f"{name}_ms": round(value, 2) for name, value in per_step.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards")
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--size", type=int, default=32, help="train crop (and evaluation) size")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20, help="batches per epoch")
    print(json.dumps(measure(parser.parse_args())), flush=True)


if __name__ == "__main__":
    main()
