"""First-batch wait per epoch of the resampled loader, with persistent workers (1) or a new DataLoader per
epoch as before (0): `python bench/firstbatch.py SHARDS 1|0` (digits demo shards, 32 px, batch 32, 2 workers)."""

from __future__ import annotations

import sys
import time

from imagenet_train.data import EpochLoader, ShardStream, resolve_source
from imagenet_train.presets import TrainPreset

if __name__ == "__main__":
    source = resolve_source(sys.argv[1])
    stream = ShardStream(urls=source.train_urls, transform=TrainPreset(32, 0.35).build(), batch_size=32, resampled=True)
    loader = EpochLoader(stream, 2, batches=20, persistent=sys.argv[2] == "1")
    for epoch in range(3):
        loader.set_epoch(epoch)
        start, first = time.time(), None
        for _ in loader:
            first = first if first is not None else time.time() - start
        print(f"epoch {epoch}: first batch {first:.2f} s, epoch {time.time() - start:.2f} s", flush=True)
    loader.close()
