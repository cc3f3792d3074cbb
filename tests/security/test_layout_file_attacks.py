"""`shards` on a tree from elsewhere: the layout's own files (its label file, the ILSVRC tars) obey the rule
its images do, so a link planted at `val_labels.txt`, `LOC_val_solution.csv` or a tar that leads out of the
tree is refused in one line unless `--follow-symlinks`, and no error prints what a label file holds."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from conftest import cli, jpeg_bytes, write_image_folder

SECRET = "root:$y$j9T$PLANTEDSECRETHASH:19000:0:99999:7:::"


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """A file outside the source tree, as /etc/shadow is: its first line must never reach the output."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    path = folder / "shadow"
    path.write_text(f"{SECRET}\nbin:*:19000:0:99999:7:::\n")
    return path


def _flat_val_tree(root: Path) -> Path:
    """An ImageFolder tree whose val/ is flat, so its labels come from the layout's `val_labels.txt`."""
    write_image_folder(root, {"n01": 2, "n02": 2})
    (root / "val").mkdir()
    for i in range(2):
        (root / "val" / f"v{i}.JPEG").write_bytes(jpeg_bytes(50 + i))
    return root


def _tar_of(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _ilsvrc_files(folder: Path) -> dict[str, Path]:
    """The two ILSVRC tars and a label file, written in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    inner = {
        f"{w}.tar": _tar_of({f"{w}_{i}.JPEG": jpeg_bytes(10 * k + i) for i in range(2)})
        for k, w in enumerate(["n01", "n02"])
    }
    files = {"train": folder / "ILSVRC2012_img_train.tar", "val": folder / "ILSVRC2012_img_val.tar"}
    files["train"].write_bytes(_tar_of(inner))
    files["val"].write_bytes(_tar_of({f"ILSVRC2012_val_{i:08d}.JPEG": jpeg_bytes(90 + i) for i in range(2)}))
    files["labels"] = folder / "val_labels.txt"
    files["labels"].write_text("ILSVRC2012_val_00000000.JPEG n01\nILSVRC2012_val_00000001.JPEG n02\n")
    return files


def _refused(result, path: Path, what: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"{path}: the {what} is a symlink leading out of the source tree" in result.stderr
    assert "--follow-symlinks" in result.stderr
    assert "PLANTEDSECRET" not in result.stdout + result.stderr


def test_a_val_labels_link_leading_out_is_refused_and_never_echoed(tmp_path, secret_file):
    source = _flat_val_tree(tmp_path / "in")
    (source / "val_labels.txt").symlink_to(secret_file)
    result = cli("shards", str(source), str(tmp_path / "out"), "--quiet")
    _refused(result, source / "val_labels.txt", "validation label file")
    assert not (tmp_path / "out" / "shards.json").exists()


def test_a_followed_label_link_that_is_no_label_file_names_the_line_not_its_content(tmp_path, secret_file):
    source = _flat_val_tree(tmp_path / "in")
    (source / "val_labels.txt").symlink_to(secret_file)
    result = cli("shards", str(source), str(tmp_path / "out"), "--quiet", "--follow-symlinks")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"{source / 'val_labels.txt'}:1: expected '<image file> <wnid>', got 1 fields" in result.stderr
    assert "PLANTEDSECRET" not in result.stdout + result.stderr


def test_a_kaggle_solution_csv_link_leading_out_is_refused(tmp_path, secret_file):
    source = tmp_path / "kaggle"
    base = source / "ILSVRC" / "Data" / "CLS-LOC"
    write_image_folder(base, {"n01": 2})
    (base / "val").mkdir()
    (base / "val" / "ILSVRC2012_val_00000000.JPEG").write_bytes(jpeg_bytes(7))
    outside = tmp_path / "elsewhere" / "solution.csv"
    outside.write_text(f"ImageId,PredictionString\n{SECRET},\n")
    (source / "LOC_val_solution.csv").symlink_to(outside)
    result = cli("shards", str(source), str(tmp_path / "out"), "--quiet")
    _refused(result, source / "LOC_val_solution.csv", "validation label file")


@pytest.mark.parametrize(("name", "what"), [("train", "train tar"), ("val", "validation tar")])
def test_an_ilsvrc_tar_link_leading_out_is_refused_unless_followed(tmp_path, name, what):
    elsewhere = _ilsvrc_files(tmp_path / "elsewhere")
    source = tmp_path / "in"
    _ilsvrc_files(source)
    linked = source / elsewhere[name].name
    linked.unlink()
    linked.symlink_to(elsewhere[name])
    _refused(cli("shards", str(source), str(tmp_path / "out"), "--quiet"), linked, what)
    followed = cli("shards", str(source), str(tmp_path / "followed"), "--quiet", "--follow-symlinks")
    assert followed.returncode == 0, followed.stderr
    index = json.loads((tmp_path / "followed" / "shards.json").read_text())
    assert index["splits"]["train"]["nsamples"] == 4 and index["splits"]["val"]["nsamples"] == 2


def test_layout_files_linked_inside_the_tree_are_still_read(tmp_path):
    source = tmp_path / "in"
    files = _ilsvrc_files(source / "originals")
    for path in files.values():
        (source / path.name).symlink_to(path)  # the tars kept in a sub-folder, linked where the layout looks
    result = cli("shards", str(source), str(tmp_path / "out"), "--quiet")
    assert result.returncode == 0, result.stderr
    index = json.loads((tmp_path / "out" / "shards.json").read_text())
    assert index["splits"]["val"]["nsamples"] == 2


def test_a_label_file_given_by_the_operator_outside_the_tree_is_read(tmp_path):
    source = _flat_val_tree(tmp_path / "in")
    labels = tmp_path / "mine" / "labels.txt"
    labels.parent.mkdir()
    labels.write_text("v0.JPEG n02\nv1.JPEG n01\n")
    result = cli("shards", str(source), str(tmp_path / "out"), "--quiet", "--val-labels", str(labels))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "content",
    [f"v0.JPEG n01 {SECRET}\n", f"v0.JPEG n01\nv1.JPEG {SECRET}\n", f"v0.JPEG n01\nv1.JPEG n02\n{SECRET} n01\n"],
    ids=["three-fields", "unknown-class", "orphan"],
)
def test_a_label_file_error_clips_what_it_echoes_and_never_prints_a_whole_line(tmp_path, content):
    source = _flat_val_tree(tmp_path / "in")
    (source / "val_labels.txt").write_text(content)
    result = cli("shards", str(source), str(tmp_path / "out"), "--quiet")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert str(source / "val_labels.txt") in result.stderr
    assert SECRET not in result.stderr  # at most a clipped excerpt of a file inside the tree


def test_a_label_file_with_control_characters_or_binary_is_one_line(tmp_path):
    source = _flat_val_tree(tmp_path / "in")
    (source / "val_labels.txt").write_bytes(b"v0.JPEG n01\nv1.JPEG \x1b]0;owned\x07n02\n")
    escaped = cli("shards", str(source), str(tmp_path / "out"), "--quiet")
    assert escaped.returncode == 2 and "\x1b" not in escaped.stderr and escaped.stderr.count("\n") == 1
    (source / "val_labels.txt").write_bytes(b"\xff\xfe\x00binary")
    binary = cli("shards", str(source), str(tmp_path / "out"), "--quiet")
    assert binary.returncode == 2 and "not UTF-8 text" in binary.stderr and binary.stderr.count("\n") == 1
