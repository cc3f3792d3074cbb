"""P6: ResNet-50 training throughput on one GPU, AMP bf16, channels_last, batch 256: synthetic data (the
ceiling) against real WebDataset shards through our loader. Skips without CUDA.

  python bench/gpu.py --shards http://HOST/shards.json --workers 12 [--compile]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from imagenet_train.compat import ensure_torchvision
from imagenet_train.data import EpochLoader, ShardStream, resolve_source
from imagenet_train.presets import TrainPreset, normalize

ensure_torchvision()
from torchvision import models  # noqa: E402


def step_rate(model, optimizer, batches, steps: int, warmup: int = 10) -> float:
    """Images/s of forward + backward + optimizer step over `steps` batches after `warmup`."""
    criterion = torch.nn.CrossEntropyLoss()
    seen, start = 0, None
    for index, (images, labels) in enumerate(batches):
        if index == warmup:
            torch.cuda.synchronize()
            start, seen = time.perf_counter(), 0
        images = normalize(images.cuda(non_blocking=True), channels_last=True)
        labels = labels.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        seen += images.shape[0]
        if index == warmup + steps:
            break
    torch.cuda.synchronize()
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", default="", help="shard index for the real-data run (omit: synthetic only)")
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--decoder", default="simplejpeg")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return
    torch.backends.cudnn.benchmark = True
    model = models.resnet50(num_classes=1000).cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if args.compile:
        model = torch.compile(model)
    batch = args.batch_size
    synthetic_batch = (
        torch.randint(0, 255, (batch, 3, 224, 224), dtype=torch.uint8).pin_memory(),
        torch.randint(0, 1000, (batch,)),
    )
    result = {
        "device": torch.cuda.get_device_name(),
        "batch": batch,
        "compile": args.compile,
        "synthetic": step_rate(model, optimizer, iter(lambda: synthetic_batch, None), args.steps),
    }
    if args.shards:
        source = resolve_source(args.shards)
        stream = ShardStream(
            urls=source.train_urls,
            transform=TrainPreset(224, decoder=args.decoder).build(),
            batch_size=batch,
            resampled=True,
        )
        loader = EpochLoader(stream, args.workers, batches=args.steps + 20, pin_memory=True)
        result["real"] = step_rate(model, optimizer, ((b[0], b[1]) for b in loader), args.steps)
        result["real_over_synthetic"] = result["real"] / result["synthetic"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
