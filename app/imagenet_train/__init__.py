"""imagenet-train: ImageNet to WebDataset shards to multinode DDP training."""

from imagenet_train import compat as _compat

__version__ = "0.1.0"

# A user's `import imagenet_train, torchvision` works next to a CPU-only torch; torch loads only when torchvision does.
_compat.install_hook()
