"""Run results to a bucket while training goes on: config, metrics, checkpoints, key logs."""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from . import gcs, transfer
from .errors import ImagenetTrainError

log = logging.getLogger(__name__)


class ResultsUploader:
    """Mirrors a run directory to gs:// in a background thread, so a checkpoint upload never blocks a step."""

    def __init__(self, run_dir: str | Path, url: str):
        gcs.split(url)  # a bad URL fails now, not after the first epoch
        self.run_dir, self.url = Path(run_dir), url.rstrip("/")
        self.sent: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) already in the bucket
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="results-upload")
        self.pending: list[Future] = []

    def sync(self) -> None:
        """Queue an upload of whatever changed in the run directory since the last one."""
        for future in self.pending:
            if future.done() and future.exception() and not getattr(future, "reported", False):
                log.error("results upload to %s failed (retried at the next sync): %s", self.url, future.exception())
                future.reported = True
        self.pending = [f for f in self.pending if not f.done() or f.exception()]
        self.pending.append(self.pool.submit(self._upload_changed))

    def _upload_changed(self) -> int:
        count = 0
        for path in sorted(p for p in self.run_dir.rglob("*") if p.is_file()):
            if ".tmp" in path.name or ".part" in path.name:
                continue
            try:
                stamp = (path.stat().st_size, path.stat().st_mtime_ns)
                if self.sent.get(str(path)) == stamp:
                    continue
                target = f"{self.url}/{path.relative_to(self.run_dir).as_posix()}"
                there = gcs.stat(target)
                if there is None or there.size != stamp[0] or there.crc32c != gcs.file_crc32c(str(path)):
                    gcs.upload(str(path), target)
                    count += 1
                self.sent[str(path)] = stamp
            except FileNotFoundError:
                continue  # a mid-epoch checkpoint pruned while we looked at it
        return count

    def finish(self) -> None:
        """Wait for every queued upload; the first failure is an error naming its URL."""
        self.sync()
        self.pool.shutdown(wait=True)
        for future in self.pending:
            if future.exception():
                raise ImagenetTrainError(str(future.exception())) from None


def fetch_for_resume(url: str, run_dir: str | Path) -> int:
    """Bring a run's files from the bucket into the run directory before resuming; 0 when none exist."""
    os.makedirs(run_dir, exist_ok=True)
    if not gcs.listing(url.rstrip("/") + "/"):
        return 0
    return transfer.sync_tree(url, str(run_dir))
