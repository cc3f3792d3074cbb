#!/usr/bin/env python3
"""Upload a run directory (or any directory) to a bucket: the operator's replacement for upload.sh.

  tools/upload.py runs/r50 gs://acme-runs/imagenet/r50 [--dry-run] [--workers 16]

Same behaviour as `imagenet-train upload`: parallel, skips files already there with the same CRC32C,
verifies every upload, resumes a large upload that was interrupted, never stores a partial object.
Credentials: Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, workload identity, gcloud).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "app"))  # runs from a checkout too

from imagenet_train.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["upload", *sys.argv[1:]]))
