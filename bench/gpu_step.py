"""The GPU step's variants side by side (issue 50): the trainer's own ResNet-50 step (bf16, channels_last, as P6)
eager, with torch's fused SGD, compiled, and compiled as a CUDA graph; each variant in turn, in one process:

- its loss over the same recorded batches from the same initial weights (the numerics, each against eager's);
- img/s on a fixed batch already on the device (the step alone) and on the real shards (with the data wait).

A variant named NAME@B runs at batch B (no loss curve: other batches, other losses). Variants that would start
after --budget-s are recorded as skipped, so a lease's time bounds the whole.

  python bench/gpu_step.py --shards DIR/shards.json --out step.json [--variants eager fused compile cudagraphs]
  python bench/gpu_step.py --shards DIR/shards.json --device cpu --arch resnet18 --crop-size 64 --batch-size 8 \\
      --variants eager fused --curve-steps 3 --steps 3 --warmup 1 --workers 1     # the CPU smoke run of the tests
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from imagenet_train.choices import CompileMode
from imagenet_train.config import Config
from imagenet_train.datasets.source import resolve_source
from imagenet_train.main.entry_checks import runnable
from imagenet_train.main.train import run_parts
from imagenet_train.training.dist import DistInfo
from imagenet_train.training.loop import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import timed  # noqa: E402 (bench/ is the script's folder)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way to run the same step."""

    title: str
    compile: bool = False
    mode: CompileMode = CompileMode.DEFAULT
    fused: bool = False


GRAPHS, AUTOTUNE = CompileMode.REDUCE_OVERHEAD, CompileMode.MAX_AUTOTUNE
VARIANTS = {
    "eager": Variant("eager (P6's step)"),
    "fused": Variant("eager, fused SGD", fused=True),
    "compile": Variant("torch.compile (default mode), fused SGD", True, fused=True),
    "cudagraphs": Variant("torch.compile reduce-overhead (CUDA graphs), fused SGD", True, GRAPHS, True),
    "autotune": Variant("torch.compile max-autotune (and CUDA graphs), fused SGD", True, AUTOTUNE, True),
}


def variant_name(text: str) -> str:
    """argparse's check of NAME or NAME@BATCH."""
    name, _, batch = text.partition("@")
    if name not in VARIANTS or (batch and not batch.isdigit()):
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(VARIANTS)}, optionally @BATCH; got '{text}'")
    return text


def trainer_for(args: argparse.Namespace, variant: Variant, batch_size: int, batches: int) -> Trainer:
    """The trainer as `imagenet-train train` builds it for this variant, on one device, resampled epochs."""
    cfg = Config()
    cfg.data.shards, cfg.loader.workers, cfg.loader.batch_size = args.shards, args.workers, batch_size
    cfg.loader.decoder, cfg.loader.epoch_batches, cfg.data.num_classes = args.decoder, batches, 1000
    cfg.augment.train_crop_size = args.crop_size
    cfg.run.arch, cfg.run.amp = args.arch, "bf16" if args.device == "cuda" else "off"
    cfg.run.compile, cfg.run.compile_mode, cfg.optim.fused_optimizer = variant.compile, variant.mode, variant.fused
    cfg.run.run_dir = tempfile.mkdtemp(prefix="bench-gpu-step-")
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    info = DistInfo(rank=0, world=1, local_rank=0, device=device)
    cfg = runnable(cfg)
    return Trainer(cfg, info, resolve_source(args.shards, num_classes=1000), run_parts(cfg, info))


def curve(trainer: Trainer, recorded: list[tuple[torch.Tensor, torch.Tensor]], lr: float) -> list[float]:
    """The loss of each step over `recorded` at `lr`, read once at the end (no host sync per step)."""
    losses = [trainer.step(images, labels, lr=lr) for images, labels in recorded]
    return [round(value, 5) for value in torch.stack(losses).tolist()]


def fixed_batch(trainer: Trainer, args: argparse.Namespace, batch_size: int) -> dict:
    """img/s on one batch already on the device, with the sync check (no host-device sync per step) on CUDA."""
    images = torch.randint(0, 255, (batch_size, 3, args.crop_size, args.crop_size), dtype=torch.uint8)
    labels = torch.randint(0, 1000, (batch_size,))
    device = trainer.info.device
    images, labels = images.to(device), labels.to(device)
    endless = iter(lambda: (images, labels, []), None)
    if device.type != "cuda":
        return timed_cpu(trainer, endless, args.steps, args.warmup)
    try:
        found = timed(trainer, endless, args.steps, args.warmup, sync_check=True)
        found["sync_check"] = "passed"
    except RuntimeError as error:  # a host sync in the step: its figure without the check, and what synced
        found = timed(trainer, endless, args.steps, args.warmup)
        found["sync_check"] = str(error).splitlines()[0][:200]
    return found


def timed_cpu(trainer: Trainer, batches, steps: int, warmup: int) -> dict:
    """gpu.timed's figures on the CPU (it synchronises CUDA)."""
    source = iter(batches)
    waited, seen, start = 0.0, 0, time.perf_counter()
    for index in range(warmup + steps):
        if index == warmup:
            start, waited, seen = time.perf_counter(), 0.0, 0
        before = time.perf_counter()
        images, labels, _ = next(source)
        waited += time.perf_counter() - before
        trainer.step(images, labels)
        seen += len(labels)
    elapsed = time.perf_counter() - start
    return {"img_s": round(seen / elapsed, 1), "data_wait": round(waited / elapsed, 3), "steps": steps}


def run_variant(args: argparse.Namespace, text: str, recorded: list) -> dict:
    """One variant's figures; records the curve's batches first when `recorded` is still empty."""
    name, _, batch = text.partition("@")
    variant, batch_size = VARIANTS[name], int(batch or args.batch_size)
    with_curve = batch_size == args.batch_size
    drawn = args.curve_steps if with_curve and not recorded else 0
    began = time.perf_counter()
    trainer = trainer_for(args, variant, batch_size, drawn + args.warmup + args.steps)
    found: dict = {"variant": text, "title": variant.title, "batch": batch_size}
    try:
        trainer.batches.train.start_epoch(0, batches=drawn + args.warmup + args.steps)
        real = trainer.batches.train_batches()
        for _ in range(drawn):
            images, labels, _keys = next(real)
            recorded.append((images.to(trainer.info.device), labels.to(trainer.info.device)))
        if with_curve:
            found["losses"] = curve(trainer, recorded, args.curve_lr)
        found["fixed"] = fixed_batch(trainer, args, batch_size)
        measure = timed if trainer.info.device.type == "cuda" else timed_cpu
        found["shards"] = measure(trainer, real, args.steps, args.warmup)
    finally:
        trainer.batches.close()
    found["seconds"] = round(time.perf_counter() - began, 1)  # compiling included
    if trainer.info.device.type == "cuda":
        found["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    return found


def forget() -> None:
    """Drop the last variant's compiled graphs and memory before the next."""
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def measure(args: argparse.Namespace) -> dict:
    """Every variant in turn (the first at the base batch records the curve's batches); skipped past the budget."""
    report: dict = {"variants": [], "args": {key: str(value) for key, value in vars(args).items()}}
    if args.device == "cuda":
        report["device"] = torch.cuda.get_device_name()
    report["torch"], started, recorded = torch.__version__, time.monotonic(), []
    for text in args.variants:
        if time.monotonic() - started > args.budget_s:
            found = {"variant": text, "skipped": f"past --budget-s {args.budget_s:g}"}
        else:
            found = run_variant(args, text, recorded)
            forget()
        report["variants"].append(found)
        print(json.dumps(found), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")  # kept if a later variant is cut off
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", required=True, help="shard index")
    parser.add_argument("--variants", nargs="+", type=variant_name, default=["eager", "fused", "compile", "cudagraphs"])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--crop-size", type=int, default=224)
    parser.add_argument("--decoder", default="simplejpeg")
    parser.add_argument("--curve-steps", type=int, default=40, help="steps of the loss curve every variant repeats")
    # At the peak LR (0.1 for 256) from fresh weights and no warmup the loss spikes to 20-50 in the first steps
    # (an H200 run, 2026-11-28), where rounding differences grow chaotically; a warmup's LR compares kernels.
    parser.add_argument("--curve-lr", type=float, default=0.01, help="the LR of the loss curve's steps")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--budget-s", type=float, default=1e9, help="start no variant after this many seconds")
    parser.add_argument("--out", default="", help="the report as JSON, rewritten after each variant")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return
    if args.device == "cuda":
        torch.cuda.set_device(0)
    measure(args)


if __name__ == "__main__":
    main()
