"""Torch files read as data: `torch.load(weights_only=True)`, so that a file planted in a run directory or a
results bucket cannot run code, after a look at the archive, so that it cannot make the load take memory out of
all proportion to its size either.

A torch file is a zip archive, and torch writes every record in it stored, uncompressed; torch.load would
inflate a deflated record all the same (a 1.9 MB file to a 2.3 GB tensor). So before loading, the archive's
directory is read: a compressed record, a record that claims more bytes than it occupies or lies outside the
file, or records that add up to more than the file itself (MAX_INFLATION) are refused in one line naming the
file. Checkpoints (rundir/checkpoint.py), --weights and `imagenet-train evaluate` read through here.
"""

from __future__ import annotations

import pickle
import re
import warnings
import zipfile
from pathlib import Path

import torch

from imagenet_train.errors import ImagenetTrainError


class MissingEntry(ImagenetTrainError):
    """A weights file without the checkpoint entry asked for."""


def load_weights(path: str | Path, entry: str = "model") -> dict[str, torch.Tensor]:
    """Model weights from a file: a state dict of tensors, or a checkpoint's `entry` ('model', or 'ema' where a
    run kept one); else one error line."""
    state = read_torch_file(Path(path), "weights file")
    if isinstance(state, dict) and isinstance(state.get(entry), dict):
        state = state[entry]
    elif entry != "model":
        raise MissingEntry(f"{path}: no '{entry}' entry; expected a checkpoint that holds one")
    if (
        not isinstance(state, dict)
        or not state
        or not all(isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in state.items())
    ):
        raise ImagenetTrainError(f"{path}: expected a state dict of tensors (or a checkpoint with a 'model' entry)")
    return dict(state)


MAX_INFLATION = 1.0  # a checkpoint's records add up to at most this times its file size (torch stores them)
_LEGACY_MAGIC = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19."  # pickled torch.serialization.MAGIC_NUMBER


def check_archive(path: Path, what: str = "checkpoint") -> None:
    """Refuse a torch zip file whose records are compressed or add up to more than the file holds."""
    try:
        size = path.stat().st_size
        if not zipfile.is_zipfile(path):
            with open(path, "rb") as stream:
                legacy = stream.read(len(_LEGACY_MAGIC)) == _LEGACY_MAGIC
            if legacy:  # its pickle declares each storage's size, allocated before the bytes are read
                raise ImagenetTrainError(
                    f"{path}: a {what} in torch's legacy (before 1.6) format, whose sizes cannot be checked before "
                    "loading; refused (re-save it with torch.save where it is trusted)"
                )
            return  # not a torch file: torch.load refuses it in one line
    except OSError:
        return  # torch.load says what is wrong with it, in one line
    except zipfile.BadZipFile:  # is_zipfile found an end record it could not read (a damaged ZIP64 locator)
        raise ImagenetTrainError(f"{path}: unreadable {what} (a damaged zip directory: BadZipFile)") from None
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except Exception as error:  # zipfile raises many kinds for a damaged directory (NotImplementedError too)
        reason = f"a damaged zip directory: {type(error).__name__}"
        raise ImagenetTrainError(f"{path}: unreadable {what} ({reason})") from None
    total = 0
    for record in records:
        name = record.filename[:80]
        if record.compress_type != zipfile.ZIP_STORED:
            raise ImagenetTrainError(
                f"{path}: {what} record {name} is stored compressed ({record.compress_size} bytes inflating to "
                f"{record.file_size}); torch writes records uncompressed, so this file was made to inflate, refused"
            )
        if record.file_size != record.compress_size or record.header_offset + record.compress_size > size:
            raise ImagenetTrainError(
                f"{path}: {what} record {name} claims {record.file_size} bytes that the {size}-byte file does not "
                "hold; refused"
            )
        total += record.file_size
    if total > MAX_INFLATION * size:
        raise ImagenetTrainError(
            f"{path}: {what} records add up to {total} bytes, more than {MAX_INFLATION:g}x the file's {size}; refused"
        )


def read_torch_file(path: Path, what: str) -> object:
    """torch.load with weights_only=True: a file that needs anything beyond tensors and plain data, or that would
    inflate past its size, is refused."""
    check_archive(path, what)
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols on stderr: the error says it all
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "GLOBAL " in str(error):  # a torch file that needs Python classes or functions to load
            raise ImagenetTrainError(_untrusted(path, what, str(error))) from None
        raise ImagenetTrainError(f"{path}: unreadable {what} (not a torch file of tensors and plain data)") from None
    except FileNotFoundError:
        raise ImagenetTrainError(f"{path}: no such {what}") from None
    except Exception as error:
        raise ImagenetTrainError(f"{path}: unreadable {what} ({type(error).__name__})") from None


def _untrusted(path: Path, what: str, message: str) -> str:
    """The one line for a file holding Python objects: what it is, and how to convert it if it is trusted."""
    found = re.search(r"GLOBAL (\S+)", message)
    named = f", such as {found.group(1).strip('`,.')[:80]}" if found else ""
    recipe = (
        "import torch; from imagenet_train.rundir.checkpoint import plain; "
        f"p = {str(path)!r}; torch.save(plain(torch.load(p, map_location='cpu', weights_only=False)), p)"
    )
    return (
        f"{path}: this {what} holds Python objects beyond tensors and plain data{named}; loading them could run "
        f'code, so it is refused. Only if you trust the file, convert it once with: python -c "{recipe}"'
    )
