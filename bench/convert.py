"""P4: `imagenet-train shards` (no re-encode) against a plain `tar` copy of the same files, and its scaling
with --workers. The page cache is warm for both (the files are read once first)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path


def _seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def run(images: Path, work: Path, workers: int) -> dict:
    cli = str(Path(sys.executable).with_name("imagenet-train"))
    _seconds(["tar", "cf", "/dev/null", "-C", str(images), "train"])  # warm the page cache
    result = {"tar": _seconds(["tar", "cf", str(work / "copy.tar"), "-C", str(images), "train"])}
    (work / "copy.tar").unlink()
    for verify in ("full", "header"):
        for count in sorted({1, workers}):
            out = work / f"convert-{verify}-{count}"
            shutil.rmtree(out, ignore_errors=True)
            command = [cli, "shards", str(images), str(out), "--workers", str(count), "--quiet"]
            result[f"shards_{verify}_{count}w"] = _seconds([*command, "--verify", verify, "--maxcount", "250"])
            shutil.rmtree(out)
    return result
