"""The validation label files of ImageNet's layouts (Kaggle's LOC_val_solution.csv, `<file> <wnid>` lines), read
with bounds: a file in someone else's tree may be anything, and its content is not ours to print."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

from imagenet_train.errors import ImagenetTrainError

# A label file is a few MB (50,000 lines); past this it is no label file, and reading it whole would not do.
MAX_LABEL_BYTES = 64 << 20


def stem(name: str) -> str:
    """An image's key: its file name without folders and extensions, spaces as underscores."""
    return os.path.basename(name).split(".", 1)[0].replace(" ", "_")


def _label_text(path: Path) -> str:
    """The label file's text, bounded; one line naming the file when it is not one."""
    if not path.is_file():
        raise ImagenetTrainError(f"{path}: validation label file not found")
    with open(path, "rb") as stream:
        data = stream.read(MAX_LABEL_BYTES + 1)
    if len(data) > MAX_LABEL_BYTES:
        raise ImagenetTrainError(f"{path}: over {MAX_LABEL_BYTES >> 20} MiB, not a validation label file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ImagenetTrainError(
            f"{path}: not UTF-8 text (expected LOC_val_solution.csv or '<image file> <wnid>' lines)"
        ) from None


def read_val_labels(path: Path) -> dict[str, str]:
    """Validation labels, image stem → wnid, from Kaggle's LOC_val_solution.csv or `<file> <wnid>` lines.

    An error names the file, the line and what was expected, never the line itself: the file may not be the
    label file the layout promised (a link planted in someone else's tree), and its content is not ours to print.
    """
    text = _label_text(path)
    labels: dict[str, str] = {}
    if text.startswith("ImageId"):
        rows = csv.DictReader(io.StringIO(text))
        try:
            for lineno, row in enumerate(rows, start=2):
                prediction = (row.get("PredictionString") or "").split()
                if not row.get("ImageId") or not prediction:
                    raise ImagenetTrainError(f"{path}:{lineno}: expected 'ImageId,PredictionString' with a wnid")
                labels[stem(row["ImageId"])] = prediction[0]
        except csv.Error:
            raise ImagenetTrainError(
                f"{path}:{rows.line_num}: not readable as CSV (expected 'ImageId,PredictionString')"
            ) from None
        return labels
    for lineno, line in enumerate(text.splitlines(), start=1):
        fields = line.replace(",", " ").split()
        if not fields:
            continue
        if len(fields) != 2:
            raise ImagenetTrainError(f"{path}:{lineno}: expected '<image file> <wnid>', got {len(fields)} fields")
        labels[stem(fields[0])] = fields[1]
    return labels
