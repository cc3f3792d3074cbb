"""imagenet-train: ImageNet to WebDataset shards to multinode DDP training."""

__version__ = "0.1.0"
