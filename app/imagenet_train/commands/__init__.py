"""The CLI's commands by concern: their options, checks and hand-off to the modules that do the work.
Each module's `add_commands` adds its subcommands to `imagenet-train` (cli.py)."""

from __future__ import annotations

import os


def deployment_file(path: str) -> dict:
    """The chart's deployment.yaml; its storage environment and writable paths are applied to this process."""
    from imagenet_train.config import read_mapping
    from imagenet_train.launchers.deployment import WRITABLE_ENV, storage_env

    document = read_mapping(path, "--deployment")
    os.environ.update({**storage_env(document, document["name"]), **os.environ, **WRITABLE_ENV})
    return document
