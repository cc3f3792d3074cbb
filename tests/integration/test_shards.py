"""`imagenet-train shards`: each input layout round-trips; quirks and bad input are reported, never dropped."""

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.datasets.source import load_index
from imagenet_train.errors import ImagenetTrainError

from conftest import jpeg_bytes, write_image_folder


def shard_samples(out: Path, split: str) -> dict[str, dict[str, bytes]]:
    """Every sample of a split, read back from the tar files the index lists."""
    index = load_index(str(out))
    samples: dict[str, dict[str, bytes]] = {}
    for url in index.urls(split):
        with tarfile.open(url) as archive:
            for member in archive:
                key, ext = member.name.split(".", 1)
                samples.setdefault(key, {})[ext] = archive.extractfile(member).read()
    return samples


def test_image_folder_round_trip_keeps_bytes_labels_and_counts(tmp_path):
    files = write_image_folder(tmp_path / "in", {"n02": 7, "n01": 5, "n03": 6}, {"n01": 2, "n02": 3, "n03": 1})
    doc = convert(str(tmp_path / "in"), str(tmp_path / "out"), ShardOptions(maxcount=4), progress=False)
    assert doc["classes"] == ["n01", "n02", "n03"]
    assert doc["splits"]["train"]["nsamples"] == 18 and doc["splits"]["val"]["nsamples"] == 6
    assert len(doc["splits"]["train"]["shardlist"]) == 5
    train = shard_samples(tmp_path / "out", "train")
    for rel, data in files.items():
        split, wnid, name = rel.split("/")
        if split != "train":
            continue
        sample = train[name.split(".")[0]]
        assert sample["jpg"] == data  # byte-identical
        assert sample["wnid"].decode() == wnid
        assert int(sample["cls"]) == doc["classes"].index(wnid)
    val = shard_samples(tmp_path / "out", "val")
    assert {s["wnid"].decode() for s in val.values()} == {"n01", "n02", "n03"}


def test_samples_are_mixed_across_shards_and_output_is_deterministic(tmp_path):
    write_image_folder(tmp_path / "in", {f"n{i:02d}": 10 for i in range(5)})
    one = convert(str(tmp_path / "in"), str(tmp_path / "a"), ShardOptions(maxcount=10, workers=1), progress=False)
    two = convert(str(tmp_path / "in"), str(tmp_path / "b"), ShardOptions(maxcount=10, workers=2), progress=False)
    assert [s["sha256"] for s in one["shardlist"]] == [s["sha256"] for s in two["shardlist"]]
    for url in load_index(str(tmp_path / "a")).urls("train"):
        with tarfile.open(url) as archive:
            classes = {m.name for m in archive if m.name.endswith(".wnid")}
        assert len({n.split("_")[0] for n in classes}) >= 3  # a shard of 10 is not one class


def test_index_is_a_wids_shard_index_with_checksums(tmp_path):
    import wids

    write_image_folder(tmp_path / "in", {"n01": 6, "n02": 6})
    doc = convert(str(tmp_path / "in"), str(tmp_path / "out"), ShardOptions(maxcount=5), progress=False)
    assert doc["__kind__"] == "wids-shard-index-v1"
    dataset = wids.ShardListDataset(str(tmp_path / "out" / "shards.json"))
    assert len(dataset) == 12
    assert dataset[0][".jpg"].size == (40, 30)  # wids decoded our JPEG
    for shard in doc["shardlist"]:
        data = (tmp_path / "out" / shard["url"]).read_bytes()
        assert shard["filesize"] == len(data)
        assert shard["md5sum"] == hashlib.md5(data).hexdigest()
        assert shard["sha256"] == hashlib.sha256(data).hexdigest()


def test_rerun_keeps_complete_shards_and_rewrites_missing_ones(tmp_path):
    write_image_folder(tmp_path / "in", {"n01": 9, "n02": 9})
    first = convert(str(tmp_path / "in"), str(tmp_path / "out"), ShardOptions(maxcount=5), progress=False)
    victim = tmp_path / "out" / first["shardlist"][1]["url"]
    victim.unlink()
    (tmp_path / "out" / first["shardlist"][2]["url"]).write_bytes(b"truncated")
    again = convert(str(tmp_path / "in"), str(tmp_path / "out"), ShardOptions(maxcount=5), progress=False)
    assert again["resumed_shards"] == len(first["entries"]) - 2
    assert [s["sha256"] for s in again["shardlist"]] == [s["sha256"] for s in first["shardlist"]]
    changed = convert(str(tmp_path / "in"), str(tmp_path / "out"), ShardOptions(maxcount=5, seed=1), progress=False)
    assert changed["resumed_shards"] == 0  # a different shuffle invalidates every shard


def test_kaggle_layout_with_flat_val_and_solution_csv(tmp_path):
    root = tmp_path / "kaggle"
    base = root / "ILSVRC" / "Data" / "CLS-LOC"
    write_image_folder(base, {"n01": 3, "n02": 4})
    (base / "val").mkdir()
    rows = ["ImageId,PredictionString"]
    for i, wnid in enumerate(["n02", "n01", "n02"]):
        (base / "val" / f"ILSVRC2012_val_{i:08d}.JPEG").write_bytes(jpeg_bytes(100 + i))
        rows.append(f"ILSVRC2012_val_{i:08d},{wnid} 1 2 3 4")
    (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    doc = convert(str(root), str(tmp_path / "out"), ShardOptions(), progress=False)
    assert doc["layout"] == "kaggle"
    val = shard_samples(tmp_path / "out", "val")
    assert val["ILSVRC2012_val_00000000"]["wnid"] == b"n02"
    assert int(val["ILSVRC2012_val_00000001"]["cls"]) == 0
    assert doc["splits"]["train"]["nsamples"] == 7


def _tar_of(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_original_ilsvrc_tars_are_read_in_place_without_extracting(tmp_path):
    root = tmp_path / "ilsvrc"
    root.mkdir()
    images = {
        wnid: {f"{wnid}_{i}.JPEG": jpeg_bytes(hash((wnid, i)) % 1000) for i in range(3)} for wnid in ("n01", "n02")
    }
    (root / "ILSVRC2012_img_train.tar").write_bytes(
        _tar_of({f"{wnid}.tar": _tar_of(members) for wnid, members in images.items()})
    )
    val = {f"ILSVRC2012_val_{i:08d}.JPEG": jpeg_bytes(500 + i) for i in range(1, 4)}
    (root / "ILSVRC2012_img_val.tar").write_bytes(_tar_of(val))
    (tmp_path / "labels.txt").write_text("".join(f"{n} {w}\n" for n, w in zip(val, ["n01", "n02", "n02"], strict=True)))
    doc = convert(
        str(root), str(tmp_path / "out"), ShardOptions(), val_labels=str(tmp_path / "labels.txt"), progress=False
    )
    assert doc["layout"] == "ilsvrc-tars"
    train = shard_samples(tmp_path / "out", "train")
    assert train["n02_1"]["jpg"] == images["n02"]["n02_1.JPEG"]
    assert shard_samples(tmp_path / "out", "val")["ILSVRC2012_val_00000002"]["wnid"] == b"n02"
    assert sorted(os.listdir(root)) == ["ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"]  # nothing extracted


@pytest.mark.parametrize("verify", ["full", "header"])
def test_imagenet_quirks_are_reencoded_or_skipped_and_reported(tmp_path, verify):
    folder = tmp_path / "in" / "train" / "n01"
    folder.mkdir(parents=True)
    good = jpeg_bytes(1)
    (folder / "n01_good.JPEG").write_bytes(good)
    (folder / "n01_gray.JPEG").write_bytes(jpeg_bytes(2, mode="L"))
    (folder / "n01_cmyk.JPEG").write_bytes(jpeg_bytes(3, mode="CMYK"))
    (folder / "n01_png.JPEG").write_bytes(jpeg_bytes(4, fmt="PNG"))
    (folder / "n01_cut.JPEG").write_bytes(good[: len(good) // 2])
    (folder / "notes.txt").write_text("not an image")
    doc = convert(str(tmp_path / "in"), str(tmp_path / "out"), ShardOptions(verify=verify), progress=False)
    reasons = {Path(r["source"]).name: r["reason"] for r in doc["reencoded"]}
    assert set(reasons) == {"n01_cmyk.JPEG", "n01_png.JPEG"}
    assert "CMYK" in reasons["n01_cmyk.JPEG"] and "PNG" in reasons["n01_png.JPEG"]
    skipped = {Path(s["source"]).name for s in doc["skipped"]}
    assert skipped == {"n01_cut.JPEG", "notes.txt"}
    samples = shard_samples(tmp_path / "out", "train")
    assert set(samples) == {"n01_good", "n01_gray", "n01_cmyk", "n01_png"}
    assert samples["n01_good"]["jpg"] == good
    from PIL import Image

    for key in ("n01_cmyk", "n01_png"):
        image = Image.open(io.BytesIO(samples[key]["jpg"]))
        assert (image.format, image.mode) == ("JPEG", "RGB")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: None, "input directory does not exist"),
        (lambda root: root.mkdir(), "no dataset found"),
        (lambda root: (root / "train").mkdir(parents=True), "no class directories"),
        (lambda root: (root / "train" / "n01").mkdir(parents=True), "class directory is empty"),
    ],
)
def test_bad_input_directories_give_one_line_errors(tmp_path, make, message):
    root = tmp_path / "in"
    make(root)
    with pytest.raises(ImagenetTrainError, match=message) as caught:
        convert(str(root), str(tmp_path / "out"), ShardOptions(), progress=False)
    assert "\n" not in str(caught.value) and str(root) in str(caught.value)


def _flat_val(tmp_path, labels: str):
    root = tmp_path / "in"
    write_image_folder(root, {"n01": 2, "n02": 2})
    (root / "val").mkdir()
    for i in range(2):
        (root / "val" / f"v{i}.JPEG").write_bytes(jpeg_bytes(50 + i))
    (tmp_path / "labels.txt").write_text(labels)
    return root


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ("v0.JPEG n01\n", "1 validation images have no label"),
        ("v0.JPEG n01\nv1.JPEG n02\nv9.JPEG n01\n", "names 1 images that are not there"),
        ("v0.JPEG n01\nv1.JPEG n07\n", "classes not in train"),
        ("v0.JPEG\n", "expected '<image file> <wnid>'"),
    ],
)
def test_label_file_that_disagrees_with_images_is_an_error(tmp_path, labels, message):
    root = _flat_val(tmp_path, labels)
    with pytest.raises(ImagenetTrainError, match=message):
        convert(
            str(root), str(tmp_path / "out"), ShardOptions(), val_labels=str(tmp_path / "labels.txt"), progress=False
        )


def test_val_labels_file_matching_images_is_used(tmp_path):
    root = _flat_val(tmp_path, "v0.JPEG n02\nv1.JPEG n01\n")
    doc = convert(
        str(root), str(tmp_path / "out"), ShardOptions(), val_labels=str(tmp_path / "labels.txt"), progress=False
    )
    assert json.loads((tmp_path / "out" / "shards.json").read_text())["splits"]["val"]["nsamples"] == 2
    assert doc["complete"] is True


def test_maxsize_and_resize_shape_the_shards(tmp_path):
    write_image_folder(tmp_path / "in", {"n01": 8})
    by_size = convert(str(tmp_path / "in"), str(tmp_path / "a"), ShardOptions(maxsize=4000), progress=False)
    assert len(by_size["shardlist"]) >= 3
    assert all(s["nsamples"] >= 1 for s in by_size["shardlist"])
    small = convert(str(tmp_path / "in"), str(tmp_path / "b"), ShardOptions(resize=12), progress=False)
    from PIL import Image

    for sample in shard_samples(tmp_path / "b", "train").values():
        assert min(Image.open(io.BytesIO(sample["jpg"])).size) == 12
    assert small["splits"]["train"]["nsamples"] == 8


def test_demo_data_is_the_digits_in_imagenet_layout(tmp_path):
    from conftest import cli

    result = cli("demo-data", str(tmp_path / "digits"), "--size", "16")
    assert result.returncode == 0, result.stderr
    assert "wrote 1438 train and 359 val images" in result.stdout
    classes = sorted(p.name for p in (tmp_path / "digits" / "train").iterdir())
    assert classes == [f"digit{i}" for i in range(10)]
    assert len(list((tmp_path / "digits" / "val").glob("*/*.JPEG"))) == 359
