"""the bucket commands: upload, sync, and the chart's fill"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from imagenet_train.commands import Command, deployment_file, one_shot_io_timeout
from imagenet_train.declarations import option, positional
from imagenet_train.limits import IO_TIMEOUT

BUCKET_URL = "gs://BUCKET/PREFIX"


def _io_timeout() -> Any:
    """--io-timeout as upload and sync take it: a one-shot command's short budget."""
    return one_shot_io_timeout(waiting_for="the bucket")


def _workers() -> Any:
    return option(8, "parallel transfers", minimum=1, maximum=256)


def _dry_run() -> Any:
    return option(False, "list what would be copied or skipped")


@dataclass
class UploadOptions:
    """`imagenet-train upload DIRECTORY URL`."""

    directory: str = positional("local directory, e.g. a run directory")
    url: str = positional(BUCKET_URL)
    workers: int = _workers()
    dry_run: bool = _dry_run()
    io_timeout: float = _io_timeout()


@dataclass
class SyncOptions:
    """`imagenet-train sync URL DIRECTORY`."""

    url: str = positional(BUCKET_URL)
    directory: str = positional("local directory")
    workers: int = _workers()
    dry_run: bool = _dry_run()
    io_timeout: float = _io_timeout()


@dataclass
class FillOptions:
    """`imagenet-train fill --deployment FILE`: the chart's fill pod."""

    deployment: str = option(None, "the chart's deployment.yaml", nonempty=True, required=True, metavar="FILE")
    directory: str = option("/shards", "where the shard volume is mounted", nonempty=True)
    # The chart's fill Job is not waited on by a person: it rides out a bucket outage as training does.
    io_timeout: float = one_shot_io_timeout(IO_TIMEOUT, "the bucket")


def _transfer(copies, copy, args: argparse.Namespace, verb: str, url: str) -> int:
    from imagenet_train.io.paths import shown
    from imagenet_train.io.transfer import check_names, run

    todo = [c for c in copies if c.action == "copy"]
    size = sum(c.size for c in todo)
    if args.dry_run:
        for item in copies:
            if item.action == "refuse":
                print(f"refuse {shown(item.source, 200)}: {item.reason}")
            else:
                print(f"{item.action:4} {item.source} -> {item.target}")
    check_names(url, copies)  # a bucket name that is not a plain path refuses the whole sync, dry run included
    if not args.dry_run:
        run(copies, copy, args.workers, args.io_timeout)
    done = "would copy" if args.dry_run else verb
    kept = len(copies) - len(todo)
    print(f"{done} {len(todo)} files ({size / 1e6:.1f} MB), {kept} already there with the same checksum")
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    """Copy a directory to a bucket prefix, skipping files already there with the same checksum."""
    from imagenet_train.io import schemes
    from imagenet_train.io.transfer import plan_upload

    store = schemes.writer_for(args.url, "URL")
    copies = plan_upload(args.directory, args.url, args.io_timeout)
    return _transfer(copies, store.upload, args, "uploaded and verified", args.url)


def cmd_sync(args: argparse.Namespace) -> int:
    """Copy a bucket prefix to a directory, skipping files already there with the same checksum."""
    from imagenet_train.io import schemes
    from imagenet_train.io.transfer import plan_sync

    store = schemes.writer_for(args.url, "URL")
    return _transfer(
        plan_sync(args.url, args.directory, args.io_timeout), store.download, args, "downloaded and verified", args.url
    )


def cmd_fill(args: argparse.Namespace) -> int:
    """Sync the deployment's shards.nginx.fill.from onto the shard volume (the chart's fill pod)."""
    from imagenet_train.io import schemes
    from imagenet_train.io.transfer import plan_sync

    fill = deployment_file(args.deployment)["shards"]["nginx"]["fill"]
    args.workers, args.dry_run = int(fill["parallel"]), False
    return _transfer(
        plan_sync(fill["from"], args.directory, args.io_timeout),
        schemes.writer_for(fill["from"], f"{args.deployment}: shards.nginx.fill.from").download,
        args,
        "downloaded and verified",
        fill["from"],
    )


COMMANDS = (
    Command(
        "upload",
        "copy a run directory (or any directory) to gs://, skipping identical files",
        UploadOptions,
        cmd_upload,
    ),
    Command("sync", "copy a gs:// prefix to a directory (e.g. to fill a shard-server volume)", SyncOptions, cmd_sync),
    Command(
        "fill",
        "the chart's fill pod: sync shards.nginx.fill.from onto the shard volume at /shards",
        FillOptions,
        cmd_fill,
    ),
)
