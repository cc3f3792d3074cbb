"""`imagenet-train fashion-mnist`: idx files (built here, tiny) into an ImageNet-layout tree whose val/ is a seeded,
class-balanced holdout or the test set; broken idx files are one line and exit 2; and the real Debian package."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imagenet_train.datasets.fashion_mnist import CLASSES, DEBIAN_SOURCE, FILES, load_split
from imagenet_train.datasets.idx import write_idx

from conftest import cli

PER_CLASS = 8  # train images per class in the tiny files
SIDE = 8


def _tiny_source(root: Path, per_class: int = PER_CLASS, test_per_class: int = 3) -> Path:
    """Fashion-MNIST's four idx files with `per_class` random SIDE x SIDE images per class (train gzipped, test raw)."""
    rng = np.random.default_rng(1)
    root.mkdir(parents=True, exist_ok=True)
    for split, count, suffix in (("train", per_class, ".gz"), ("test", test_per_class, "")):
        labels = rng.permutation(np.repeat(np.arange(len(CLASSES)), count)).astype(np.uint8)
        images = rng.integers(0, 256, (len(labels), SIDE, SIDE), dtype=np.uint8)
        write_idx(root / (FILES[split][0] + suffix), images)
        write_idx(root / (FILES[split][1] + suffix), labels)
    return root


def _names(root: Path, split: str) -> dict[str, list[str]]:
    return {c: sorted(p.name for p in (root / split / c).glob("*.JPEG")) for c in CLASSES}


def _one_line_error(result, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("imagenet-train: error: ")
    for fragment in fragments:
        assert fragment in last


def test_holdout_is_class_balanced_disjoint_from_train_and_seeded(tmp_path):
    source = _tiny_source(tmp_path / "idx")
    made = cli("fashion-mnist", str(tmp_path / "a"), "--source", str(source), "--holdout", "20", "--quiet")
    assert made.returncode == 0, made.stderr
    assert "wrote 60 train and 20 val images (held out of the train set)" in made.stdout
    train, val = _names(tmp_path / "a", "train"), _names(tmp_path / "a", "val")
    assert all(len(val[c]) == 2 and len(train[c]) == PER_CLASS - 2 for c in CLASSES)
    assert not set(sum(train.values(), [])) & set(sum(val.values(), []))
    assert all(name.startswith("train_") for name in sum(val.values(), []))
    with Image.open(next((tmp_path / "a" / "val").glob("*/*.JPEG"))) as image:
        assert image.mode == "RGB" and image.size == (28, 28)  # --size defaults to 28
    assert json.loads((tmp_path / "a" / "fashion-mnist.json").read_text())["counts"] == {"train": 60, "val": 20}

    again = cli("fashion-mnist", str(tmp_path / "b"), "--source", str(source), "--holdout", "20", "--quiet")
    other = cli("fashion-mnist", str(tmp_path / "c"), "--source", str(source), "--holdout", "20", "--seed", "7")
    assert again.returncode == 0 and other.returncode == 0
    assert _names(tmp_path / "b", "val") == val
    assert _names(tmp_path / "c", "val") != val


def test_train_size_draws_a_class_balanced_subset_of_the_rest(tmp_path):
    source = _tiny_source(tmp_path / "idx")
    out = tmp_path / "out"
    made = cli("fashion-mnist", str(out), "--source", str(source), "--holdout", "10", "--train-size", "30", "--quiet")
    assert made.returncode == 0, made.stderr
    assert all(len(names) == 3 for names in _names(out, "train").values())
    assert all(len(names) == 1 for names in _names(out, "val").values())


def test_val_from_test_evaluates_on_the_test_set_and_trains_on_every_train_image(tmp_path):
    source = _tiny_source(tmp_path / "idx")
    out = tmp_path / "out"
    made = cli("fashion-mnist", str(out), "--source", str(source), "--val-from", "test", "--size", "16", "--quiet")
    assert made.returncode == 0, made.stderr
    assert "wrote 80 train and 30 val images (the test set)" in made.stdout
    val = sum(_names(out, "val").values(), [])
    assert len(val) == 30 and all(name.startswith("test_") for name in val)
    with Image.open(out / "val" / CLASSES[0] / _names(out, "val")[CLASSES[0]][0]) as image:
        assert image.size == (16, 16)


def test_the_tree_shards_into_train_and_val(tmp_path):
    out = tmp_path / "out"
    assert (
        cli(
            "fashion-mnist", str(out), "--source", str(_tiny_source(tmp_path / "idx")), "--holdout", "20", "--quiet"
        ).returncode
        == 0
    )
    made = cli("shards", str(out), str(tmp_path / "shards"), "--quiet")
    assert made.returncode == 0, made.stderr
    assert "train: 60 samples" in made.stdout and "classes: 10" in made.stdout and "re-encoded" not in made.stdout


@pytest.mark.parametrize(
    ("damage", "fragments"),
    [
        (lambda b: b"\0\0\x0d\x03" + b[4:], ["not an idx file", "magic 00000d03"]),
        (lambda b: b[:-5], ["truncated"]),
        (lambda b: b + b"\0", ["longer than its header says"]),
        (lambda b: b[:4] + (2**31).to_bytes(4, "big") + b[8:], ["items; expected 1 to"]),
        (lambda b: b[:8] + (100_000).to_bytes(4, "big") + b[12:], ["image size 100000x8"]),
        (lambda b: b"\1\2", ["not an idx file"]),
        (
            lambda b: b[:4] + (10_000_000).to_bytes(4, "big") + (28).to_bytes(4, "big") + b[12:],
            ["2240000000 bytes of data; expected at most"],
        ),
    ],
    ids=["magic", "truncated", "trailing", "count", "side", "tiny", "bytes"],
)
def test_a_broken_images_file_is_one_line_naming_it(tmp_path, damage, fragments):
    source = _tiny_source(tmp_path / "idx")
    path = source / (FILES["train"][0] + ".gz")
    path.write_bytes(gzip.compress(damage(gzip.decompress(path.read_bytes()))))
    result = cli("fashion-mnist", str(tmp_path / "out"), "--source", str(source), "--quiet")
    _one_line_error(result, str(path), *fragments)


def test_broken_labels_and_bad_counts_are_one_line(tmp_path):
    source = _tiny_source(tmp_path / "idx")
    labels = source / (FILES["train"][1] + ".gz")
    write_idx(labels, np.full(10 * PER_CLASS, 10, dtype=np.uint8))
    _one_line_error(cli("fashion-mnist", str(tmp_path / "a"), "--source", str(source)), "label 10; expected 0 to 9")
    write_idx(labels, np.zeros(5, dtype=np.uint8))
    _one_line_error(cli("fashion-mnist", str(tmp_path / "b"), "--source", str(source)), "80 images but 5 labels")
    labels.write_bytes(b"\x1f\x8b not gzip at all")
    _one_line_error(cli("fashion-mnist", str(tmp_path / "c"), "--source", str(source)), "cannot read the idx file")
    good = _tiny_source(tmp_path / "good")
    _one_line_error(
        cli("fashion-mnist", str(tmp_path / "d"), "--source", str(good), "--holdout", "15"),
        "--holdout 15: expected a multiple of 10",
    )
    _one_line_error(
        cli("fashion-mnist", str(tmp_path / "e"), "--source", str(good), "--holdout", "40", "--train-size", "50"),
        "class 0-tshirt-top has 8 images",
    )
    _one_line_error(cli("fashion-mnist", str(tmp_path / "f"), "--source", str(tmp_path)), "no train-images-idx3-ubyte")
    default = cli("fashion-mnist", str(tmp_path / "g"), "--source", str(good))  # --holdout 5000 of 80 images
    _one_line_error(default, "class 0-tshirt-top has 8 images; expected 500 held out plus 1 for train/")


def test_an_existing_tree_is_never_added_to(tmp_path):
    source = _tiny_source(tmp_path / "idx")
    assert cli("fashion-mnist", str(tmp_path / "out"), "--source", str(source), "--holdout", "20").returncode == 0
    again = cli("fashion-mnist", str(tmp_path / "out"), "--source", str(source), "--seed", "3")
    _one_line_error(again, "exists and is not empty")


@pytest.mark.skipif(
    not Path(DEBIAN_SOURCE, FILES["train"][0] + ".gz").is_file(),
    reason=f"Debian's dataset-fashion-mnist is not installed ({DEBIAN_SOURCE}); `make system-deps` installs it",
)
def test_the_debian_package_gives_the_real_60000_and_10000(tmp_path):
    out = tmp_path / "out"
    made = cli("fashion-mnist", str(out), "--train-size", "100", "--holdout", "1000", "--quiet")
    assert made.returncode == 0, made.stderr
    assert "wrote 100 train and 1000 val images" in made.stdout
    assert all(len(names) == 100 for names in _names(out, "val").values())
    with Image.open(next((out / "train").glob("*/*.JPEG"))) as image:
        assert image.size == (28, 28)
    for split, count in (("train", 60_000), ("test", 10_000)):
        images, labels = load_split(DEBIAN_SOURCE, split)
        assert images.shape == (count, 28, 28)
        assert np.bincount(labels).tolist() == [count // 10] * 10
