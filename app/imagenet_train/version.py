"""What `imagenet-train --version` prints: the package's version, the git revision it was built from (when known)
and the torch and Python it runs on."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from imagenet_train import __version__

REVISION_ENV = "IMAGENET_TRAIN_REVISION"  # set by the training image (images/train/Dockerfile's REVISION)
GIT_TIMEOUT_S = 2.0


def revision() -> str:
    """The git revision: the image's, else the checkout's this package runs from (an editable install), else
    'unknown' (a wheel outside the image)."""
    given = os.environ.get(REVISION_ENV, "").strip()
    if given and given != "unknown":
        return given[:12]
    here = Path(__file__).resolve().parent
    try:
        found = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    text = found.stdout.strip()
    return text if found.returncode == 0 and text.isalnum() else "unknown"


def _installed(package: str) -> str:
    """An installed distribution's version without importing it (torch takes seconds to import)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def version_line() -> str:
    """'imagenet-train 0.1.0 (git abc5a5b...) torch 2.5.1, Python 3.11.7'."""
    return (
        f"imagenet-train {__version__} (git {revision()}) torch {_installed('torch')}, "
        f"Python {platform.python_version()}"
    )
