"""The CLI's commands by concern: their options, checks and hand-off to the modules that do the work.
Each module's `add_commands` adds its subcommands to `imagenet-train` (cli.py); `Parser` gives them all
the one-line error format."""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

from imagenet_train.errors import one_line


class Parser(argparse.ArgumentParser):
    """argparse with the project's error format: one line naming the flag, exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Exit with code 2 after one `imagenet-train: error:` line naming the flag."""
        message = message.removeprefix("argument ")
        self.exit(2, f"imagenet-train: error: {one_line(message)}\n")


def deployment_file(path: str) -> dict:
    """The chart's deployment.yaml; its storage environment and writable paths are applied to this process."""
    from imagenet_train.deployment import WRITABLE_ENV, storage_env
    from imagenet_train.yaml_input import read_mapping

    document = read_mapping(path, "--deployment")
    os.environ.update({**storage_env(document, document["name"]), **os.environ, **WRITABLE_ENV})
    return document
