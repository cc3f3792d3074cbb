#!/usr/bin/env python3
"""Train with Lightning on shards: `python examples/lightning_digits.py --shards URL --epochs 12 [train options]`.

Takes the options of `imagenet-train train`; Lightning's DDP starts the other ranks by running this
script again. Rank 0 prints the final validation metrics as one JSON line. Lightning runs resampled mode only:
with a recipe in queue or split mode (recipes/small-images.yaml is in queue mode), add `--mode resampled`.
"""

import json
import sys

from imagenet_train.commands.train_cmd import train_config
from imagenet_train.errors import ImagenetTrainError

# `lightning` comes through the adapter, which first makes torchvision importable next to a CPU-only torch.
from imagenet_train.launchers.lightning_module import ImagenetModule, ShardDataModule, lightning


def main() -> int:
    """Train, then print rank 0's final validation metrics; a bad option is one line and exit 2."""
    try:
        cfg = train_config(sys.argv[1:])
        data = ShardDataModule(cfg)
        model = ImagenetModule(cfg, data.source.num_classes)
        trainer = lightning.Trainer(
            strategy="ddp",
            accelerator="cpu",
            devices=2,
            max_epochs=cfg.run.epochs,
            default_root_dir=cfg.run.run_dir,
            enable_checkpointing=False,
            enable_progress_bar=False,
            num_sanity_val_steps=0,
        )
        trainer.fit(model, datamodule=data)
    except ImagenetTrainError as error:
        print(f"lightning_digits: error: {error}", file=sys.stderr)
        return 2
    if trainer.is_global_zero:
        print(json.dumps(model.history[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
