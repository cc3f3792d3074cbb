"""Fashion-MNIST (Zalando's 70,000 28 px grey product photos, 10 classes; Debian's dataset-fashion-mnist) as an
ImageNet-layout JPEG tree, with a seeded, class-balanced validation set held out of its train set.

Every choice is tuned on the held-out part (`--val-from holdout`); the 10,000 test images are for the figures
a report gives (`--val-from test`), so the tree `shards` reads says which of the two it evaluates on.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from imagenet_train.datasets.idx import read_idx
from imagenet_train.errors import ImagenetTrainError

DEBIAN_SOURCE = "/usr/share/datasets/fashion-mnist"
APT_PACKAGE = "dataset-fashion-mnist"
# Label order of the dataset; the numeric prefix keeps it when folders are sorted into class indices.
CLASSES = (
    "0-tshirt-top",
    "1-trouser",
    "2-pullover",
    "3-dress",
    "4-coat",
    "5-sandal",
    "6-shirt",
    "7-sneaker",
    "8-bag",
    "9-ankle-boot",
)
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MANIFEST = "fashion-mnist.json"


class ValFrom(str, Enum):
    """What the tree's val/ holds (the --val-from word)."""

    HOLDOUT = "holdout"  # --holdout images kept out of the 60,000 train images: for tuning
    TEST = "test"  # the 10,000 test images: for reported figures only; train/ draws on all 60,000

    def __str__(self) -> str:
        return self.value


def load_split(source: str | Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """A split's images (N x H x W uint8) and labels (N), read from `source`'s idx files (gzip or raw)."""
    images_name, labels_name = FILES[split]
    images = read_idx(_find(Path(source), images_name), 3)
    labels = read_idx(_find(Path(source), labels_name), 1)
    if len(images) != len(labels):
        raise ImagenetTrainError(
            f"{source}: {split} has {len(images)} images but {len(labels)} labels; expected one label per image"
        )
    if labels.max() >= len(CLASSES):
        raise ImagenetTrainError(f"{source}/{labels_name}: label {int(labels.max())}; expected 0 to {len(CLASSES) - 1}")
    return images, labels


def _find(source: Path, name: str) -> Path:
    """NAME.gz or NAME under `source`, or the line saying where the files come from."""
    for candidate in (source / f"{name}.gz", source / name):
        if candidate.is_file():
            return candidate
    hint = f" (apt-get install {APT_PACKAGE})" if str(source) == DEBIAN_SOURCE else ""
    raise ImagenetTrainError(f"{source}: no {name}.gz or {name}; expected Fashion-MNIST's idx files{hint}")


def choose(
    labels: np.ndarray, holdout: int, train_size: int, seed: int, keep_holdout: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """The train and held-out indices into `labels`: class-balanced, drawn with `seed`, disjoint, each sorted.

    `holdout` (a multiple of the class count) images are held out; `train_size` (0: all the rest) are drawn
    from the rest. With keep_holdout off nothing is held out and train_size draws on every image.
    """
    classes = len(CLASSES)
    for flag, count in (("--holdout", holdout), ("--train-size", train_size)):
        if count % classes:
            raise ImagenetTrainError(f"{flag} {count}: expected a multiple of {classes} (the same count per class)")
    rng = np.random.default_rng(seed)
    per_holdout = holdout // classes if keep_holdout else 0
    train, held = [], []
    for label in range(classes):
        members = rng.permutation(np.flatnonzero(labels == label))
        rest = len(members) - per_holdout
        per_train = train_size // classes or rest
        if per_holdout + per_train > len(members) or rest < 1:
            raise ImagenetTrainError(
                f"--holdout {holdout} --train-size {train_size}: class {CLASSES[label]} has {len(members)} images; "
                f"expected {per_holdout} held out plus {max(per_train, 1)} for train/ per class to fit in them"
            )
        held.append(members[:per_holdout])
        train.append(members[per_holdout : per_holdout + per_train])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(held))


def write_fashion_mnist(
    root: str | Path,
    source: str | Path = DEBIAN_SOURCE,
    holdout: int = 5000,
    train_size: int = 0,
    val_from: ValFrom = ValFrom.HOLDOUT,
    size: int = 28,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, int]:
    """Write `train/<class>/*.JPEG` and `val/<class>/*.JPEG` (and the manifest); returns the count per split."""
    root = Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        # Two draws in one tree would mix held-out images into train/: a new tree each time.
        raise ImagenetTrainError(f"{root}: exists and is not empty; expected a new directory")
    images, labels = load_split(source, "train")
    train, held = choose(labels, holdout, train_size, seed, keep_holdout=val_from == ValFrom.HOLDOUT)
    plan = [("train", "train", images, labels, train)]
    if val_from == ValFrom.HOLDOUT:
        plan.append(("val", "train", images, labels, held))
    else:
        test_images, test_labels = load_split(source, "test")
        plan.append(("val", "test", test_images, test_labels, np.arange(len(test_labels))))
    total = sum(len(chosen) for *_, chosen in plan)
    counts = {}
    with tqdm(total=total, desc="fashion-mnist", unit="img", disable=not progress) as bar:
        for split, origin, pixels, targets, chosen in plan:
            for folder in CLASSES:
                (root / split / folder).mkdir(parents=True, exist_ok=True)
            for i in chosen:
                image = Image.fromarray(pixels[i], "L")
                if size != image.width:
                    image = image.resize((size, size), Image.Resampling.BICUBIC)
                # The name keeps the image's index in its idx file: the tree says which images it drew.
                name = root / split / CLASSES[targets[i]] / f"{origin}_{i:05d}.JPEG"
                image.convert("RGB").save(name, "JPEG", quality=95)
                bar.update()
            counts[split] = len(chosen)
    manifest = {
        "source": str(source),
        "val_from": val_from.value,
        "holdout": holdout if val_from == ValFrom.HOLDOUT else 0,
        "train_size": int(len(train)),
        "seed": seed,
        "size": size,
        "counts": counts,
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return counts
