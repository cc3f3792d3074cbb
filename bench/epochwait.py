"""Per-epoch first-batch wait and host-side step overhead on CPU, the trainer's loop as it runs.

Each epoch of a Trainer on the given shards: the time from asking for the epoch's first batch to having it,
and per step the wall time spent outside `Trainer.step` (forward, backward, optimizer) - the host-side
overhead a GPU would wait through. Runs against whichever imagenet_train is on PYTHONPATH, so the same
script measures the code before and after a change.

  python bench/epochwait.py SHARDS ARCH IMAGE_SIZE BATCH WORKERS EPOCHS BATCHES_PER_EPOCH
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

import torch

from imagenet_train.config import Config
from imagenet_train.data import resolve_source
from imagenet_train.dist import DistInfo
from imagenet_train.train import Trainer


def main() -> None:
    shards, arch, size, batch, workers, epochs, per_epoch = sys.argv[1:8]
    torch.set_num_threads(1)
    cfg = Config()
    cfg.data.shards, cfg.data.image_size, cfg.data.val_resize = shards, int(size), int(size)
    cfg.data.batch_size, cfg.data.workers, cfg.data.epoch_batches = int(batch), int(workers), int(per_epoch)
    cfg.run.arch, cfg.run.epochs, cfg.run.run_dir = arch, int(epochs), tempfile.mkdtemp(prefix="bench-epochwait-")
    trainer = Trainer(cfg.validate(), DistInfo(0, 1, 0, torch.device("cpu")), resolve_source(shards))
    first_waits, outside, inside = [], [], []
    for epoch in range(int(epochs)):
        trainer.train_loader.set_epoch(epoch)
        feed = trainer.batches(trainer.train_loader, trainer.train_augment) if hasattr(trainer, "batches") else None
        source = iter(feed if feed is not None else trainer.train_loader)
        mark = time.perf_counter()
        for index, (images, labels, _) in enumerate(source):
            got = time.perf_counter()
            if index == 0:
                first_waits.append(got - mark)
            else:
                outside.append(got - mark)
            trainer.step(images, labels)
            mark = time.perf_counter()
            inside.append(mark - got)
    close = getattr(trainer.train_loader, "close", None)
    if close:
        close()
    print(
        json.dumps(
            {
                "first_batch_s": [round(w, 3) for w in first_waits],
                "later_epochs_first_batch_s": round(sum(first_waits[1:]) / max(len(first_waits) - 1, 1), 3),
                "step_ms": round(1e3 * sum(inside) / len(inside), 1),
                "outside_step_ms": round(1e3 * sum(outside) / max(len(outside), 1), 1),
            }
        )
    )


if __name__ == "__main__":
    main()
