"""Run results to a bucket while training goes on: config, metrics, checkpoints, key logs.

Uploads run on a daemon thread, so a checkpoint upload never blocks a step and a bucket outage never stops
training: each file is retried with backoff for up to --io-timeout, and what still failed is tried again at
the next sync. The end of the run waits for the mirror, bounded, and names whatever did not arrive.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path

from imagenet_train import waiting
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import schemes, transfer
from imagenet_train.io.owned import owned_folder
from imagenet_train.limits import IO_TIMEOUT
from imagenet_train.rundir.run_record import METRICS, epoch_lines, merge_fetched

log = logging.getLogger(__name__)


def upload_order(path: Path) -> tuple[bool, Path]:
    """Checkpoints (*.pt) after every other file, each group by name."""
    return path.suffix == ".pt", path


class ResultsUploader:
    """Mirrors a run directory to a bucket (a scheme with a writer) in the background (see the module docstring)."""

    def __init__(self, run_dir: str | Path, url: str, io_timeout: float = IO_TIMEOUT):
        self.store = schemes.writer_for(url, "--results")
        self.store.split(url)  # a bad URL fails now, not after the first epoch
        self.run_dir, self.url, self.io_timeout = Path(run_dir), url.rstrip("/"), io_timeout
        self.sent: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) already in the bucket
        self.requests: queue.Queue[bool] = queue.Queue()
        self.outstanding = 0  # syncs asked for and not yet done
        self.changed = threading.Condition()
        threading.Thread(target=self._serve, name="results-upload", daemon=True).start()

    def sync(self) -> None:
        """Queue an upload of whatever changed in the run directory since the last one."""
        with self.changed:
            self.outstanding += 1
        self.requests.put(True)

    def _serve(self) -> None:
        while True:
            self.requests.get()
            try:
                self._upload_changed()
            except Exception as error:  # never let the mirror thread die: the next sync tries again
                log.error("results upload to %s failed (retried at the next sync): %s", self.url, error)
            with self.changed:
                self.outstanding -= 1
                self.changed.notify_all()

    def pending(self) -> list[str]:
        """Files of the run directory not (or not in their current version) in the bucket."""
        return [
            str(path.relative_to(self.run_dir)) for path, stamp in self._files() if self.sent.get(str(path)) != stamp
        ]

    def stamps(self) -> dict[str, tuple[int, int]]:
        """The run directory's files now, with their (size, mtime)."""
        return {str(path): stamp for path, stamp in self._files()}

    def fetched(self, before: dict[str, tuple[int, int]]) -> None:
        """Take the files a fetch from the bucket wrote since `before` as in the bucket already. Every node
        fetches, but only rank 0 writes metrics, config and checkpoints: another node's copy goes stale as soon
        as rank 0 writes again, and uploaded, it would replace rank 0's newer file in the bucket."""
        for path, stamp in self._files():
            if before.get(str(path)) != stamp:
                self.sent[str(path)] = stamp

    def _files(self) -> list[tuple[Path, tuple[int, int]]]:
        """The run directory's files with their (size, mtime), checkpoints last: a checkpoint in the bucket
        then always has the metrics lines of the epochs before it there too."""
        found = []
        for path in sorted((p for p in self.run_dir.rglob("*") if p.is_file()), key=upload_order):
            if ".tmp" in path.name or ".part" in path.name:
                continue
            try:
                info = path.stat()
            except FileNotFoundError:
                continue  # a mid-epoch checkpoint pruned while we looked
            found.append((path, (info.st_size, info.st_mtime_ns)))
        return found

    def _upload_changed(self) -> None:
        for path, stamp in self._files():
            if self.sent.get(str(path)) == stamp:
                continue
            target = f"{self.url}/{path.relative_to(self.run_dir).as_posix()}"
            try:
                there = self.store.stat(target, self.io_timeout)
                if there is None or there.size != stamp[0] or there.crc32c != self.store.file_crc32c(str(path)):
                    self.store.upload(str(path), target, self.io_timeout)
                self.sent[str(path)] = stamp
            except FileNotFoundError:
                continue
            except ImagenetTrainError as error:
                log.error("results: %s did not upload (retried at the next sync): %s", path.name, error)

    def finish(self, timeout: float, stoppable: bool = True) -> list[str]:
        """Wait up to `timeout` s for the mirror to catch up; returns the files still not in the bucket. A stop
        signal ends the wait with waiting.Stopping (unless it is the stop's own, bounded flush)."""
        self.sync()
        ends = time.monotonic() + timeout
        with self.changed:
            while self.outstanding and time.monotonic() < ends:
                if stoppable:
                    waiting.check("flushing the results mirror")
                self.changed.wait(min(waiting.SLICE_S * 5, max(0.0, ends - time.monotonic())))
        return self.pending()


def fetch_for_resume(url: str, run_dir: str | Path, io_timeout: float = IO_TIMEOUT) -> int:
    """Bring a run's files from the bucket into the run directory before resuming; 0 when none exist.
    metrics.jsonl is merged epoch by epoch with the one already here, not replaced."""
    owned_folder(run_dir, f"--run-dir {run_dir}")
    if not schemes.writer_for(url, "--results").listing(url.rstrip("/") + "/", io_timeout):
        return 0
    metrics = Path(run_dir) / METRICS
    local = epoch_lines(metrics)
    fetched = transfer.sync_tree(url, str(run_dir), io_timeout=io_timeout, private=True)
    merge_fetched(metrics, local)
    return fetched


class ResultsMirror:
    """A run's --results mirror as the loop uses it: one uploader per node (its local rank 0), a no-op elsewhere
    and without --results."""

    def __init__(self, run_dir: str | Path, url: str, io_timeout: float, local_rank: int):
        self.run_dir, self.url, self.io_timeout, self.local_rank = Path(run_dir), url, io_timeout, local_rank
        self.uploader = ResultsUploader(run_dir, url, io_timeout) if url and local_rank == 0 else None

    def fetch_for_resume(self, say: bool) -> None:
        """--resume latest: bring the run's files from the bucket first (one rank per node fetches)."""
        if self.local_rank == 0:
            before = self.uploader.stamps() if self.uploader else {}
            fetched = fetch_for_resume(self.url, self.run_dir, self.io_timeout)
            if self.uploader:
                self.uploader.fetched(before)
            if say:
                print(f"fetched {fetched} files from {self.url} to resume", flush=True)

    def sync(self) -> None:
        """Start uploading what changed in the run directory."""
        if self.uploader:
            self.uploader.sync()

    def finish(self, timeout: float, stoppable: bool = True) -> None:
        """Wait (bounded) for the mirror; files that did not reach the bucket are one error line."""
        if not self.uploader:
            return
        left = self.uploader.finish(timeout, stoppable)
        if left:
            names = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
            raise ImagenetTrainError(
                f"--results {self.url}: {len(left)} files did not upload ({names}); they are in "
                f"{self.run_dir}, and --resume latest uploads them"
            )
