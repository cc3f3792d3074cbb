"""the bucket commands: upload, sync, and the chart's fill"""

from __future__ import annotations

import argparse

from imagenet_train.commands import deployment_file
from imagenet_train.declarations import number, text
from imagenet_train.io.resumable import IO_TIMEOUT


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
    """Copy a directory to a gs:// prefix, skipping files already there with the same checksum."""
    from imagenet_train.io import gcs
    from imagenet_train.io.transfer import plan_upload

    copies = plan_upload(args.directory, args.url, args.io_timeout)
    return _transfer(copies, gcs.upload, args, "uploaded and verified", args.url)


def cmd_sync(args: argparse.Namespace) -> int:
    """Copy a gs:// prefix to a directory, skipping files already there with the same checksum."""
    from imagenet_train.io import gcs
    from imagenet_train.io.transfer import plan_sync

    return _transfer(
        plan_sync(args.url, args.directory, args.io_timeout), gcs.download, args, "downloaded and verified", args.url
    )


def cmd_fill(args: argparse.Namespace) -> int:
    """Sync the deployment's shards.nginx.fill.from onto the shard volume (the chart's fill pod)."""
    from imagenet_train.io import gcs
    from imagenet_train.io.transfer import plan_sync

    fill = deployment_file(args.deployment)["shards"]["nginx"]["fill"]
    args.workers, args.dry_run = int(fill["parallel"]), False
    return _transfer(
        plan_sync(fill["from"], args.directory, args.io_timeout),
        gcs.download,
        args,
        "downloaded and verified",
        fill["from"],
    )


def _add_io_timeout(parser: argparse.ArgumentParser, seconds) -> None:
    """--io-timeout as the bucket commands take it (train's own comes from its declaration)."""
    parser.add_argument(
        "--io-timeout",
        type=seconds,
        default=IO_TIMEOUT,
        help="seconds to wait out a bucket outage before failing (default: %(default)g)",
    )


def add_commands(commands: argparse._SubParsersAction, formatter: type) -> None:
    """Add the bucket commands to the CLI."""
    seconds = number(float, 0, 7 * 24 * 3600)
    upload = commands.add_parser(
        "upload",
        formatter_class=formatter,
        help="copy a run directory (or any directory) to gs://, skipping identical files",
    )
    upload.add_argument("directory", type=text, help="local directory, e.g. a run directory")
    upload.add_argument("url", type=text, help="gs://BUCKET/PREFIX")
    sync = commands.add_parser(
        "sync",
        formatter_class=formatter,
        help="copy a gs:// prefix to a directory (e.g. to fill a shard-server volume)",
    )
    sync.add_argument("url", type=text, help="gs://BUCKET/PREFIX")
    sync.add_argument("directory", type=text, help="local directory")
    for transfer, func in ((upload, cmd_upload), (sync, cmd_sync)):
        transfer.add_argument("--workers", type=number(int, 1, 256), default=8, help="parallel transfers")
        transfer.add_argument("--dry-run", action="store_true", help="list what would be copied or skipped")
        _add_io_timeout(transfer, seconds)
        transfer.set_defaults(func=func)
    fill = commands.add_parser(
        "fill",
        formatter_class=formatter,
        help="the chart's fill pod: sync shards.nginx.fill.from onto the shard volume at /shards",
    )
    fill.add_argument("--deployment", type=text, required=True, metavar="FILE", help="the chart's deployment.yaml")
    fill.add_argument("--directory", type=text, default="/shards", help="where the shard volume is mounted")
    _add_io_timeout(fill, seconds)
    fill.set_defaults(func=cmd_fill)
