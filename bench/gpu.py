"""P6: ResNet-50 training throughput on one GPU through the trainer's own step (bf16, channels_last, batch
256): a fixed batch already on the GPU (the ceiling) against real shards through our loader (CPU decode, or
--decoder dali), with the fraction of wall time the training thread waited for data. Skips without CUDA.

  python bench/gpu.py --shards http://HOST/shards.json --workers 8 --decoder simplejpeg [--synthetic]
  python bench/gpu.py --shards http://HOST/shards.json --decoder dali --sync-check   # no host sync per step
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from imagenet_train.choices import CompileMode
from imagenet_train.config import Config
from imagenet_train.datasets.source import resolve_source
from imagenet_train.main.entry_checks import runnable
from imagenet_train.main.train import run_parts
from imagenet_train.training.dist import DistInfo
from imagenet_train.training.loop import Trainer


def trainer_for(args: argparse.Namespace, batches: int) -> Trainer:
    """The trainer as `imagenet-train train` builds it, on one GPU, resampled epochs of `batches` batches."""
    cfg = Config()
    cfg.data.shards, cfg.loader.workers, cfg.loader.batch_size = args.shards, args.workers, args.batch_size
    cfg.loader.decoder, cfg.loader.epoch_batches, cfg.data.num_classes = args.decoder, batches, 1000
    cfg.augment.train_crop_size = args.crop_size
    cfg.run.arch, cfg.run.amp, cfg.run.compile = "resnet50", "bf16", args.compile
    cfg.run.compile_mode, cfg.optim.fused_optimizer = CompileMode(args.compile_mode), args.fused_optimizer
    cfg.run.run_dir = tempfile.mkdtemp(prefix="bench-gpu-")
    info = DistInfo(rank=0, world=1, local_rank=0, device=torch.device("cuda", 0))
    torch.cuda.set_device(0)
    cfg = runnable(cfg)
    return Trainer(cfg, info, resolve_source(args.shards, num_classes=1000), run_parts(cfg, info))


def timed(trainer: Trainer, batches, steps: int, warmup: int, sync_check: bool = False) -> dict:
    """img/s of `steps` trainer steps after `warmup`, and the share of wall time spent waiting for a batch."""
    source = iter(batches)
    waited, seen, start = 0.0, 0, time.perf_counter()
    try:
        for index in range(warmup + steps):
            if index == warmup:
                torch.cuda.synchronize()
                start, waited, seen = time.perf_counter(), 0.0, 0
                if sync_check:
                    torch.cuda.set_sync_debug_mode("error")  # any host-device sync from here on raises
            before = time.perf_counter()
            images, labels, _ = next(source)
            waited += time.perf_counter() - before
            trainer.step(images, labels)
            seen += len(labels)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {"img_s": round(seen / elapsed, 1), "data_wait": round(waited / elapsed, 3), "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", required=True, help="shard index (the model and loaders are the trainer's)")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--crop-size", type=int, default=224, help="train crop size (P6 runs 160, 192 and 224)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--compile-mode", default="default", choices=[str(mode) for mode in CompileMode])
    parser.add_argument("--fused-optimizer", action="store_true", help="SGD as one fused kernel")
    parser.add_argument("--decoder", default="simplejpeg")
    parser.add_argument("--synthetic", action="store_true", help="also time a fixed batch on the GPU (the ceiling)")
    parser.add_argument("--sync-check", action="store_true", help="fail on any host-device sync in the timed steps")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return
    trainer = trainer_for(args, args.warmup + args.steps)
    result = {"device": torch.cuda.get_device_name(), "batch": args.batch_size, "compile": args.compile}
    result.update(compile_mode=args.compile_mode, fused_optimizer=args.fused_optimizer)
    result["crop_size"] = args.crop_size
    if args.synthetic:
        images = torch.randint(
            0, 255, (args.batch_size, 3, args.crop_size, args.crop_size), dtype=torch.uint8, device="cuda"
        )
        labels = torch.randint(0, 1000, (args.batch_size,), device="cuda")
        result["synthetic"] = timed(trainer, iter(lambda: (images, labels, []), None), args.steps, args.warmup)
    name = f"{args.decoder}_{args.workers}w"
    try:
        trainer.batches.train.start_epoch(0, batches=args.warmup + args.steps)
        result[name] = timed(trainer, trainer.batches.train_batches(), args.steps, args.warmup, args.sync_check)
        if args.sync_check:
            result[name]["sync_check"] = f"passed: no host-device sync in {args.steps} steps"
    except RuntimeError as error:
        result[name] = {"error": str(error).splitlines()[0][:300]}
    finally:
        trainer.batches.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
