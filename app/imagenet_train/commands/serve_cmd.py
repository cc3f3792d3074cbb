"""the shard-source commands: serve (nginx) and probe"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from imagenet_train.commands import deployment_file
from imagenet_train.config import declaration
from imagenet_train.declarations import add_flag, number, text
from imagenet_train.errors import ImagenetTrainError


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve a shard directory with nginx until Ctrl-C or SIGTERM."""
    from imagenet_train.ops.serve import NginxServer

    # Before nginx starts: a SIGTERM that came between the banner and a later handler would end this process
    # at once and leave nginx running with no one to stop it (seen under load).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with NginxServer(
        args.directory, host=args.host, port=args.port, workers=args.nginx_workers, access_log=args.access_log
    ) as server:
        print(f"serving {server.root} at {server.url}/ (nginx pid {server.pid}); Ctrl-C stops", flush=True)
        if args.pid_file:
            with open(args.pid_file, "w") as stream:
                stream.write(f"{os.getpid()}\n")
        try:
            while server.process.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    """Check a shard source by reading its index and one shard (retrying for --wait), and print what was read."""
    from imagenet_train.ops.probe import probe, wait_for

    location = args.location
    if args.deployment:
        from imagenet_train.deployment import shards_url

        document = deployment_file(args.deployment)
        location = shards_url(document, document["name"])
    if not location:
        raise ImagenetTrainError("probe: give the shard index (LOCATION) or --deployment FILE")
    trust, verify = args.trust_index, args.verify_shards
    result = (
        wait_for(location, args.wait, split=args.split, trust_index=trust, verify=verify)
        if args.wait
        else probe(location, args.split, trust_index=trust, verify=verify)
    )
    print(
        f"{result.index}: {result.samples} {args.split} samples in {result.shards} shards; "
        f"read {result.shard} ({result.shard_bytes} bytes, {result.shard_samples} samples)",
        flush=True,
    )
    return 0


def add_commands(commands: argparse._SubParsersAction, formatter: type) -> None:
    """Add the shard-source commands to the CLI."""
    port = number(int, 0, 65535)
    seconds = number(float, 0, 7 * 24 * 3600)
    serve = commands.add_parser("serve", formatter_class=formatter, help="serve a shard directory with nginx")
    serve.add_argument("directory", type=text, help="directory holding the shards and shards.json")
    serve.add_argument("--host", type=text, default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=port, default=8080, help="port (0: a free one)")
    serve.add_argument("--nginx-workers", type=number(int, 1, 256), default=2, help="nginx worker processes")
    serve.add_argument("--access-log", action="store_true", help="keep an access log")
    serve.add_argument("--pid-file", default=None, help="write this command's pid here")
    serve.set_defaults(func=cmd_serve)

    probe = commands.add_parser(
        "probe", formatter_class=formatter, help="check a shard source: fetch the index and read one shard"
    )
    # default None, not "": argparse runs `type` over a string default, and text("") is an error.
    probe.add_argument(
        "location", type=text, nargs="?", default=None, help="index (shards.json), its directory, or a URL to either"
    )
    probe.add_argument(
        "--deployment", default="", metavar="FILE", help="probe the shard source of the chart's deployment.yaml"
    )
    probe.add_argument("--split", type=text, default="train", help="split whose first shard is read")
    probe.add_argument("--wait", type=seconds, default=0, help="retry for up to this many seconds (0: once)")
    add_flag(probe, *declaration("trust_index"), given_only=False)
    add_flag(probe, *declaration("verify_shards"), given_only=False, context="the shard read: ")
    probe.set_defaults(func=cmd_probe)
