"""A run's directory as the trainer uses it (`RunDirectory`): the checkpoints with the state they restore, the
epoch records and their experiment tracker (rank 0), the mirror to --results, the position key logs, the
keys each rank read (--log-keys, `write_keys`) and the final weights (`write_final`).

The key logs say which sample keys each rank fetched in each segment of an epoch, read back on a mid-epoch resume
to skip what a checkpoint already consumed (the arithmetic is planning/position.py's). Each rank appends one line
per batch it fetches, before the step runs, to `RUN_DIR/position/epoch-EEEE/rank-RRRR-from-SSSSSS.keys`
("<batch index> <key> <key> ..."), where S is the step the segment started at.

Keys come from tar member names, which are shard input: one may hold a newline, a space or bytes that are not
UTF-8. Each key is written percent-encoded (its UTF-8 bytes, undecodable ones as they were in the tar), so no
key can start a line of its own or split into two keys; the resume reads only lines that are whole
(newline-terminated) and made of a batch index and well-formed encoded keys, and ignores the rest, so a
forged or torn line can at worst repeat samples, never skip one that was not trained.

RUN_DIR must be a directory of this user that no one else may write to (made 0700 when absent; io/owned.py), as
must every folder the run makes in it: another user who could write there could plant a link at config.json or a
key log and have the run write through it. Records are written 0600, replaced by rename or appended without
following a link (io/atomic.py).
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import IO, Any

import torch

from imagenet_train.config import Config, RunConfig
from imagenet_train.datasets.source import DataSource
from imagenet_train.io.atomic import appending, atomic_write
from imagenet_train.io.owned import owned_folder
from imagenet_train.planning.position import Position, consumed_spans
from imagenet_train.planning.schedule import Schedule
from imagenet_train.rundir.checkpoint import RunState, Stateful, resume_path, save
from imagenet_train.rundir.results_mirror import ResultsMirror
from imagenet_train.rundir.run_record import EpochRecords, RankPlacement, derived, startup_line
from imagenet_train.rundir.trackers import open_tracker

FINAL = "final.pt"  # RUN_DIR/final.pt: the final weights as a plain state dict


class RunDirectory:
    """RUN_DIR on one rank: `state` writes and restores checkpoints, `records` (rank 0, else None) the epochs'
    lines and the tracker, `mirror` copies the directory to --results."""

    def __init__(
        self,
        run: RunConfig,
        io_timeout: float,
        local_rank: int,
        is_main: bool,
        parts: dict[str, Stateful],
        facts: dict[str, Any],
    ):
        self.path = owned_folder(run.run_dir, f"--run-dir {run.run_dir}")
        self.state = RunState(self.path, parts, facts, run.keep_checkpoints)
        self.mirror = ResultsMirror(self.path, run.results, io_timeout, local_rank)
        self.records = EpochRecords(self.path, run.tensorboard, open_tracker(run)) if is_main else None

    def checkpoint_for(self, resume: str, rank: int, world: int) -> Path | None:
        """The checkpoint --resume names ('latest': the newest every rank holds), or None when there is none."""
        return resume_path(resume, str(self.path), rank, world)

    def consumed_keys(self, position: Position) -> frozenset[str]:
        """The keys of the samples read up to `position` in its epoch, from the key logs (exact modes' resume)."""
        return frozenset(consumed_keys(self.path, position))

    def key_log(self, epoch: int, rank: int, start: int) -> KeyLog:
        """This rank's position key log of `epoch`, from step `start` (exact modes)."""
        return KeyLog(self.path, epoch, rank, start)

    def write_keys(self, split: str, epoch: int, rank: int, keys: list[str], append: bool = False) -> None:
        """--log-keys: the keys this rank read in `split`'s epoch `epoch`."""
        write_keys(self.path, split, epoch, rank, keys, append)

    def write_final(self, state: dict[str, torch.Tensor]) -> Path:
        """RUN_DIR/final.pt: the run's final weights as a plain state dict."""
        path = self.path / FINAL
        save(state, path)
        return path

    def begin(
        self,
        cfg: Config,
        info: RankPlacement,
        schedule: Schedule,
        source: DataSource,
        amp: torch.dtype | None,
        epoch: int,
    ) -> None:
        """Rank 0: config.json with what the run derived from its settings and launch, and the tracker's run."""
        if self.records:
            facts = derived(info, schedule, source, amp, epoch, cfg.augment)
            print(startup_line(cfg, facts), flush=True)
            self.records.begin(cfg.to_json(), facts)


# A batch index, then keys as `encode_key` writes them (unreserved ASCII and '/', or %XX escapes).
_LINE = re.compile(r"(0|[1-9][0-9]{0,11})((?: (?:[A-Za-z0-9_.~/-]|%[0-9A-F]{2})+)*)")


def encode_key(key: str) -> str:
    """A sample key as one printable token with no space or line break, which `decode_key` reverses."""
    return urllib.parse.quote(key.encode("utf-8", "surrogateescape"), safe="/")


def decode_key(token: str) -> str:
    """The key `encode_key` wrote (undecodable bytes come back as the tar reader gives them)."""
    return urllib.parse.unquote_to_bytes(token).decode("utf-8", "surrogateescape")


def epoch_folder(run_dir: str | Path, epoch: int) -> Path:
    """The folder of one epoch's key logs."""
    return Path(run_dir) / "position" / f"epoch-{epoch:04d}"


def run_folder(run_dir: str | Path, *names: str) -> Path:
    """RUN_DIR/NAME/..., each level made 0700 when absent and checked to be ours (io/owned.py)."""
    folder = Path(run_dir)
    for name in names:
        folder = owned_folder(folder / name)
    return folder


class KeyLog:
    """This rank's log of fetched batches for one segment of one epoch."""

    def __init__(self, run_dir: str | Path, epoch: int, rank: int, start: int):
        folder = run_folder(run_dir, *epoch_folder("", epoch).parts)
        self.stream: IO[str] = appending(folder / f"rank-{rank:04d}-from-{start:06d}.keys")

    def fetched(self, index: int, keys: list[str]) -> None:
        """Record the sample keys of batch `index`, written out before its step runs."""
        # Flushed per batch: a SIGKILL loses nothing the OS already has.
        self.stream.write(" ".join([str(index), *map(encode_key, keys)]) + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Close the log file."""
        self.stream.close()


def write_keys(run_dir: Path, split: str, epoch: int, rank: int, keys: list[str], append: bool = False) -> None:
    """Write the keys `rank` read of `split` in `epoch` to RUN_DIR/keys (the --log-keys debug record), one a line,
    percent-encoded as the key log writes them (a tar member name may hold a newline or undecodable bytes)."""
    path = run_folder(run_dir, "keys") / f"{split}-epoch{epoch:04d}-rank{rank}.txt"
    text = "".join(encode_key(key) + "\n" for key in keys)
    with appending(path) if append else atomic_write(path, "w", private=True) as stream:
        stream.write(text)


def logged_batches(text: str) -> list[tuple[int, list[str]]]:
    """(batch index, keys) of every well-formed, newline-terminated line of a key log; other lines are ignored."""
    batches = []
    for line in text.split("\n")[:-1]:  # the last piece has no newline: torn by a crash, or empty
        if match := _LINE.fullmatch(line):
            batches.append((int(match.group(1)), [decode_key(token) for token in match.group(2).split()]))
    return batches


def consumed_keys(run_dir: str | Path, position: Position) -> set[str]:
    """Every key all ranks consumed in `position.epoch` before `position.step`, over all its segments."""
    folder = epoch_folder(run_dir, position.epoch)
    keys: set[str] = set()
    for start, stop in consumed_spans(position):
        for log in sorted(folder.glob(f"rank-*-from-{start:06d}.keys")):
            for index, logged in logged_batches(log.read_text(encoding="ascii", errors="replace")):
                if start <= index < stop:
                    keys.update(logged)
    return keys
