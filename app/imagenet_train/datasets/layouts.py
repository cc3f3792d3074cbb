"""Finding the images of a dataset in its on-disk layout: ImageFolder, Kaggle, or the original ILSVRC tars."""

from __future__ import annotations

import io
import logging
import os
import tarfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from imagenet_train.datasets.label_files import read_val_labels, stem
from imagenet_train.errors import ImagenetTrainError, clip, visible

log = logging.getLogger(__name__)

TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
KAGGLE_ROOT = Path("ILSVRC/Data/CLS-LOC")
KAGGLE_VAL_LABELS = "LOC_val_solution.csv"
# Characters of a name from a label file an error shows: an ImageNet name or wnid whole, never a whole line.
EXCERPT = 40


class SourceTooLarge(ValueError):
    """A source image over the size cap, found before it is read (the message says how big)."""


@dataclass(frozen=True)
class SourceImage:
    """One image: a whole file, or `size` bytes at `offset` inside a (tar) file."""

    key: str
    wnid: str
    path: str
    offset: int = -1
    size: int = 0
    name: str = ""  # the image's own file name, for reports

    def read(self, limit: int = 0) -> bytes:
        """The image's bytes; SourceTooLarge, before they are read, when there are more than `limit` (0: any)."""
        with open(self.path, "rb") as stream:
            if self.offset < 0:
                size = os.fstat(stream.fileno()).st_size
                if limit and size > limit:
                    raise SourceTooLarge(f"{size} bytes, over the {limit}-byte cap on a source image")
                data = stream.read(limit + 1 if limit else -1)
                if limit and len(data) > limit:  # grew since, or a file whose size stat does not know
                    raise SourceTooLarge(f"more than {limit} bytes, over the cap on a source image")
                return data
            if limit and self.size > limit:
                raise SourceTooLarge(f"{self.size} bytes, over the {limit}-byte cap on a source image")
            stream.seek(self.offset)
            return stream.read(self.size)

    def describe(self) -> str:
        """Where the image is, for reports: its file, or the tar file and its member's name."""
        return self.path if self.offset < 0 else f"{self.path}:{self.name}"


@dataclass
class Dataset:
    layout: str
    classes: list[str]
    splits: dict[str, list[SourceImage]] = field(default_factory=dict)
    outside_links: list[str] = field(default_factory=list)  # symlinks not followed: they lead out of the source


class _Tree:
    """The source tree being walked: which of its symlinks lead out of it (skipped unless followed)."""

    def __init__(self, root: Path, follow_symlinks: bool, progress: bool = False):
        self.real = os.path.realpath(root)
        self.follow = follow_symlinks
        self.outside: list[str] = []
        self.progress = progress  # a bar per split while its class folders are listed (1,000 for ImageNet)

    def leads_out(self, path: str | Path) -> bool:
        """Whether `path` resolves (through symlinks) out of the tree, unless --follow-symlinks reads them all."""
        if self.follow:
            return False
        real = os.path.realpath(path)
        return not (real == self.real or real.startswith(self.real.rstrip(os.sep) + os.sep))

    def inside(self, path: str | Path, is_link: bool = True) -> bool:
        """Whether `path` may be read: not a symlink (or under one) resolving out of the tree; notes it if so."""
        if not is_link or not self.leads_out(path):
            return True
        self.outside.append(str(path))
        return False

    def own_file(self, path: Path, what: str) -> Path:
        """`path`, a file the layout itself names (a tar, a label file); refused in one line if it leads out.

        Not skipped as an image would be: a dataset without its train tar or its labels is no dataset, and a
        link out of the tree is what a hostile tree uses to make `shards` read (and echo) a file elsewhere.
        """
        if self.leads_out(path):
            raise ImagenetTrainError(
                f"{path}: the {what} is a symlink leading out of the source tree; pass --follow-symlinks to read it"
            )
        return path

    def files(self, folder: Path) -> list[Path]:
        """The regular files directly in `folder` (a symlink leading out of the tree is left out, and noted)."""
        with os.scandir(folder) as entries:  # d_type: no extra stat for plain files
            found = [Path(e.path) for e in entries if e.is_file() and self.inside(e.path, e.is_symlink())]
        return sorted(found)


def _keyed(split: str, images: list[SourceImage]) -> list[SourceImage]:
    """Give every image a unique key; fall back to `<wnid>_<stem>` where stems repeat across classes."""
    counts = Counter(image.key for image in images)
    if all(count == 1 for count in counts.values()):
        return images
    renamed = [SourceImage(f"{i.wnid}_{i.key}", i.wnid, i.path, i.offset, i.size, i.name) for i in images]
    duplicates = [key for key, count in Counter(i.key for i in renamed).items() if count > 1]
    if duplicates:
        raise ImagenetTrainError(f"{split}: image name '{duplicates[0]}' occurs twice in one class")
    return renamed


def _class_dirs(root: Path, what: str, tree: _Tree) -> list[Path]:
    if not root.is_dir():
        raise ImagenetTrainError(f"{root}: {what} directory not found")
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and tree.inside(p))
    if not dirs and tree.outside:
        raise ImagenetTrainError(
            f"{root}: its class directories lead out of the source tree through symlinks "
            f"(first: {tree.outside[0]}); pass --follow-symlinks to read them"
        )
    if not dirs:
        raise ImagenetTrainError(f"{root}: no class directories in {what} (expected {root}/<wnid>/*.JPEG)")
    return dirs


def _folder_images(class_dir: Path, tree: _Tree) -> list[SourceImage]:
    return [
        SourceImage(stem(f.name), class_dir.name, str(f), size=f.stat().st_size, name=f.name)
        for f in tree.files(class_dir)
    ]


def _image_folder_split(root: Path, split: str, classes: list[str] | None, tree: _Tree) -> list[SourceImage]:
    images: list[SourceImage] = []
    for class_dir in scanning(_class_dirs(root, split, tree), f"scanning {split}", tree.progress):
        found = _folder_images(class_dir, tree)
        if not found and split == "train":
            raise ImagenetTrainError(f"{class_dir}: class directory is empty (expected images)")
        if classes is not None and class_dir.name not in classes:
            raise ImagenetTrainError(f"{class_dir}: class '{class_dir.name}' is not among the train classes")
        images.extend(found)
    if not images:
        raise ImagenetTrainError(f"{root}: no images in the {split} split")
    return images


def _val_labels(root: Path, given: Path | None, tree: _Tree, missing: str) -> tuple[dict[str, str], str]:
    """The validation labels and where they came from: `--val-labels`, else the layout's own label file."""
    path = given or _default_val_labels(root)
    if path is None:
        raise ImagenetTrainError(missing)
    if given is None or _under(given, root):  # a file in the tree obeys its rule, however it was named
        tree.own_file(path, "validation label file")
    return read_val_labels(path), str(path)


def _under(path: Path, root: Path) -> bool:
    """Whether `path` names a place inside `root`, as written (before any symlink is resolved)."""
    where, top = os.path.abspath(path), os.path.abspath(root)
    return where == top or where.startswith(top.rstrip(os.sep) + os.sep)


def _apply_val_labels(images: list[SourceImage], labels: dict[str, str], classes: list[str], where: str):
    missing = [i.name for i in images if i.key not in labels]
    if missing:
        raise ImagenetTrainError(
            f"{where}: {len(missing)} validation images have no label (first: {clip(missing[0], EXCERPT)})"
        )
    names = {i.key for i in images}
    orphans = sorted(set(labels) - names)
    if orphans:
        raise ImagenetTrainError(
            f"{where}: label file names {len(orphans)} images that are not there (first: {clip(orphans[0], EXCERPT)})"
        )
    unknown = sorted({labels[i.key] for i in images} - set(classes))
    if unknown:
        raise ImagenetTrainError(f"{where}: labels use classes not in train (first: {clip(unknown[0], EXCERPT)})")
    return [SourceImage(i.key, labels[i.key], i.path, i.offset, i.size, i.name) for i in images]


class _Window(io.RawIOBase):
    """A seekable view of `size` bytes at `offset` of an open file, so nested tars are indexed in place."""

    def __init__(self, stream, offset: int, size: int):
        self.stream, self.offset, self.size, self.position = stream, offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, position: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: self.size}[whence]
        self.position = max(0, min(self.size, base + position))
        return self.position

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.size - self.position)
        if count <= 0:
            return 0
        self.stream.seek(self.offset + self.position)
        data = self.stream.read(count)
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def _tar_members(path: str, stream, offset: int = 0, size: int | None = None):
    """Regular members of a tar (optionally nested at `offset`) as (name, absolute offset, size)."""
    window = _Window(stream, offset, size if size is not None else os.fstat(stream.fileno()).st_size)
    try:
        with tarfile.open(fileobj=window, mode="r:") as archive:
            for member in archive:
                if member.isreg():
                    yield member.name, offset + member.offset_data, member.size
    except tarfile.TarError as error:
        raise ImagenetTrainError(f"{path}: not a readable tar ({error})") from None


def scanning(items: list, what: str, shown: bool) -> Iterable:
    """`items` with a progress bar named `what` while a source's folders or tars are listed (minutes on ImageNet)."""
    from tqdm import tqdm

    return tqdm(items, desc=what, unit="class", disable=not shown)


def _ilsvrc_tars(root: Path, val_labels: Path | None, tree: _Tree) -> Dataset:
    train_tar = tree.own_file(root / TRAIN_TAR, "train tar")
    splits: dict[str, list[SourceImage]] = {}
    classes: list[str] = []
    with open(train_tar, "rb") as stream:
        train: list[SourceImage] = []
        members = list(_tar_members(str(train_tar), stream))
        for name, offset, size in scanning(members, f"scanning {TRAIN_TAR}", tree.progress):
            if not name.endswith(".tar"):
                continue
            wnid = stem(name)
            inner = [
                SourceImage(stem(n), wnid, str(train_tar), o, s, f"{name}/{n}")
                for n, o, s in _tar_members(f"{train_tar}:{name}", stream, offset, size)
            ]
            if not inner:
                raise ImagenetTrainError(f"{train_tar}:{name}: class tar is empty (expected images)")
            classes.append(wnid)
            train.extend(inner)
    if not train:
        raise ImagenetTrainError(f"{train_tar}: no per-class tars inside (expected n*.tar members)")
    classes.sort()
    splits["train"] = train
    val_tar = root / VAL_TAR
    if val_tar.exists():
        tree.own_file(val_tar, "validation tar")
        labels, where = _val_labels(
            root,
            val_labels,
            tree,
            f"{val_tar}: validation labels needed; pass --val-labels (LOC_val_solution.csv or '<file> <wnid>')",
        )
        with open(val_tar, "rb") as stream:
            val = [SourceImage(stem(n), "", str(val_tar), o, s, n) for n, o, s in _tar_members(str(val_tar), stream)]
        splits["val"] = _apply_val_labels(val, labels, classes, where)
    return Dataset("ilsvrc-tars", classes, splits)


def _default_val_labels(root: Path) -> Path | None:
    for candidate in (root / KAGGLE_VAL_LABELS, root / "val_labels.txt"):
        if candidate.is_file():
            return candidate
    return None


def _kaggle(root: Path, val_labels: Path | None, tree: _Tree) -> Dataset:
    base = root / KAGGLE_ROOT
    train = _image_folder_split(base / "train", "train", None, tree)
    classes = sorted({i.wnid for i in train})
    splits = {"train": train}
    val_dir = base / "val"
    if val_dir.is_dir() and tree.inside(val_dir):
        files = tree.files(val_dir)
        val = [SourceImage(stem(f.name), "", str(f), size=f.stat().st_size, name=f.name) for f in files]
        missing = f"{val_dir}: flat validation images need {root / KAGGLE_VAL_LABELS}"
        labels, where = _val_labels(root, val_labels, tree, missing)
        splits["val"] = _apply_val_labels(val, labels, classes, where)
    return Dataset("kaggle", classes, splits)


def _image_folder(root: Path, val_labels: Path | None, tree: _Tree) -> Dataset:
    train = _image_folder_split(root / "train", "train", None, tree)
    classes = sorted({i.wnid for i in train})
    splits = {"train": train}
    if (root / "val").is_dir() and tree.inside(root / "val"):
        val_root = root / "val"
        if any(p.is_dir() for p in val_root.iterdir()):
            splits["val"] = _image_folder_split(val_root, "val", classes, tree)
        else:
            labels, where = _val_labels(root, val_labels, tree, f"{val_root}: flat validation images need --val-labels")
            files = tree.files(val_root)
            val = [SourceImage(stem(f.name), "", str(f), size=f.stat().st_size, name=f.name) for f in files]
            splits["val"] = _apply_val_labels(val, labels, classes, where)
    return Dataset("imagefolder", classes, splits)


def discover(
    root: str | Path, val_labels: str | Path | None = None, follow_symlinks: bool = False, progress: bool = False
) -> Dataset:
    """Recognise the layout under `root` and list every image with its class, split and unique key.

    Symlinks that lead out of `root` are not followed (an image there is not part of this dataset, and a
    shard must not carry a file from elsewhere on the machine); they are listed in `outside_links`.
    """
    root = Path(root)
    labels = Path(val_labels) if val_labels else None
    if not root.exists():
        raise ImagenetTrainError(f"{root}: input directory does not exist")
    if not root.is_dir():
        raise ImagenetTrainError(f"{root}: expected a directory holding the dataset")
    tree = _Tree(root, follow_symlinks, progress)
    if (root / TRAIN_TAR).is_file():
        dataset = _ilsvrc_tars(root, labels, tree)  # two files named by the layout, read in place: nothing to walk
    elif (root / KAGGLE_ROOT).is_dir():
        dataset = _kaggle(root, labels, tree)
    elif (root / "train").is_dir():
        dataset = _image_folder(root, labels, tree)
    else:
        raise ImagenetTrainError(
            f"{root}: no dataset found; expected train/<wnid>/*.JPEG, {KAGGLE_ROOT}/train/, or {TRAIN_TAR}"
        )
    dataset.splits = {split: _keyed(split, images) for split, images in dataset.splits.items()}
    dataset.outside_links = tree.outside
    if tree.outside:
        first = visible(", ".join(tree.outside[:3]))  # names from the source tree
        log.warning(
            "%d symlinks lead out of %s and were not followed (first: %s); --follow-symlinks reads them",
            len(tree.outside),
            root,
            first,
        )
    return dataset
