"""the shard-source commands: serve (nginx) and probe"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass

from imagenet_train.commands import Command, deployment_file, training
from imagenet_train.declarations import option, positional
from imagenet_train.errors import ImagenetTrainError

WEEK = 7 * 24 * 3600  # seconds: the longest wait a command takes


@dataclass
class ServeOptions:
    """`imagenet-train serve DIRECTORY`."""

    directory: str = positional("directory holding the shards and shards.json")
    host: str = option("127.0.0.1", "address to listen on", nonempty=True)
    port: int = option(8080, "port (0: a free one)", minimum=0, maximum=65535)
    nginx_workers: int = option(2, "nginx worker processes", minimum=1, maximum=256)
    access_log: bool = option(False, "keep an access log")
    pid_file: str | None = option(None, "write this command's pid here")


@dataclass
class ProbeOptions:
    """`imagenet-train probe [LOCATION]`."""

    # default None, not "": argparse runs `type` over a string default, and an empty text is an error.
    location: str | None = positional("index (shards.json), its directory, or a URL to either", optional=True)
    deployment: str = option("", "probe the shard source of the chart's deployment.yaml", metavar="FILE")
    split: str = option("train", "split whose first shard is read", nonempty=True)
    wait: float = option(0, "retry for up to this many seconds (0: once)", kind=float, minimum=0, maximum=WEEK)
    trust_index: bool = training("trust_index", given_only=False)
    verify_shards: bool = training("verify_shards", given_only=False, context="the shard read: ")


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
            while server.running():
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


COMMANDS = (
    Command("serve", "serve a shard directory with nginx", ServeOptions, cmd_serve),
    Command("probe", "check a shard source: fetch the index and read one shard", ProbeOptions, cmd_probe),
)
