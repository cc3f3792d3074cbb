"""the dataset commands: shards, summarize, demo-data, fashion-mnist"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Any

from imagenet_train.commands import Command, one_shot_io_timeout, training
from imagenet_train.datasets.fashion_mnist import DEBIAN_SOURCE, ValFrom
from imagenet_train.datasets.images import ImageCheck
from imagenet_train.declarations import option, positional
from imagenet_train.errors import visible
from imagenet_train.limits import MAX_IMAGE_PIXELS


@dataclass
class ShardsOptions:
    """`imagenet-train shards SOURCE OUTPUT`."""

    source: str = positional("ImageFolder tree, Kaggle layout, or directory with the ILSVRC2012 tars")
    output: str = positional("directory (or gs://BUCKET/PREFIX) for the shards and shards.json")
    staging: str | None = option(None, "with a gs:// output: local directory to write to first")
    prefix: str = option("imagenet-train", "shard name prefix", nonempty=True)
    maxcount: int = option(1000, "samples per shard at most", minimum=1, maximum=10_000_000)
    maxsize: int = option(3_000_000_000, "bytes per shard at most (approx.)", minimum=1 << 20, maximum=1 << 40)
    workers: int = option(1, "parallel shard writers", minimum=1, maximum=512)
    seed: int = option(0, "seed of the sample shuffle across shards", minimum=0, maximum=2**63 - 1)
    resize: int = option(0, "re-encode images with a larger short side (0: keep)", minimum=0, maximum=16384)
    quality: int = option(90, "JPEG quality when re-encoding", minimum=1, maximum=100)
    verify: str = option(
        ImageCheck.FULL.value,
        "full: decode every image (catches any corruption); header: header and end marker (I/O speed)",
        choices=ImageCheck,
    )
    max_image_pixels: int = option(
        MAX_IMAGE_PIXELS,
        "skip (and list) images whose header claims more pixels than this, before decoding them (0: no cap)",
        minimum=0,
        maximum=1 << 32,
    )
    val_labels: str | None = option(None, "LOC_val_solution.csv or '<file> <wnid>' lines")
    list: int = option(20, "skipped/re-encoded files to list", minimum=0)
    follow_symlinks: bool = option(
        False,
        "read images through symlinks that lead out of the source tree (by default they are skipped and listed)",
    )
    quiet: bool = option(False, "no progress bar")


@dataclass
class SummarizeOptions:
    """`imagenet-train summarize LOCATION`."""

    location: str = positional("shard directory, shards.json, or a URL to either")
    json: bool = option(False, "machine-readable output")
    trust_index: bool = training("trust_index", given_only=False)
    io_timeout: float = one_shot_io_timeout()


@dataclass
class DemoDataOptions:
    """`imagenet-train demo-data OUTPUT`."""

    output: str = positional("directory for train/ and val/")
    size: int = option(64, "image side in pixels", minimum=8, maximum=4096)
    seed: int = option(0, "seed of the train/val split", minimum=0, maximum=2**32 - 1)


@dataclass
class FashionMnistOptions:
    """`imagenet-train fashion-mnist OUTPUT`."""

    output: str = positional("new directory for train/, val/ and fashion-mnist.json")
    source: str = option(DEBIAN_SOURCE, "folder with the four idx files (.gz or raw)", nonempty=True)
    val_from: str = option(
        ValFrom.HOLDOUT.value,
        "what val/ holds: holdout (--holdout images kept out of the 60,000 train images, for tuning) or test "
        "(the 10,000 test images, for reported figures only; train/ then draws on all 60,000)",
        choices=ValFrom,
    )
    holdout: int = option(
        5000,
        "with --val-from holdout: train images held out as val/, the same number per class",
        minimum=0,
        maximum=60_000,
    )
    train_size: int = option(
        0, "class-balanced subset of the remaining train images to write (0: all of them)", minimum=0, maximum=60_000
    )
    size: int = option(28, "image side in pixels (bicubic)", minimum=8, maximum=4096)
    seed: int = option(0, "seed of the holdout and subset", minimum=0, maximum=2**32 - 1)
    quiet: bool = option(False, "no progress bar")


def cmd_shards(args: argparse.Namespace) -> int:
    """Convert a dataset into shards and their index, and report what was kept, skipped or re-encoded."""
    from imagenet_train.datasets.convert import ShardOptions, convert
    from imagenet_train.io import schemes

    options = ShardOptions(
        prefix=args.prefix,
        maxcount=args.maxcount,
        maxsize=args.maxsize,
        workers=args.workers,
        seed=args.seed,
        resize=args.resize or None,
        quality=args.quality,
        verify=args.verify,
        max_pixels=args.max_image_pixels,
    )
    output = args.output
    if schemes.name_of(output) != "file":
        schemes.writer_for(output, "OUTPUT")  # a bucket without a writer is refused before any shard is written
        # Shards are written locally first (resumable there with --staging), then uploaded and verified.
        import tempfile

        output = args.staging or tempfile.mkdtemp(prefix="imagenet-train-shards-")
    document = convert(
        args.source,
        output,
        options,
        val_labels=args.val_labels,
        progress=not args.quiet,
        follow_symlinks=args.follow_symlinks,
    )
    if output != args.output:
        from imagenet_train.io.transfer import upload_tree

        sent = upload_tree(output, args.output)
        print(f"uploaded {sent} files from {output} to {args.output} (verified by CRC32C)")
    for split, info in document["splits"].items():
        print(f"{split}: {info['nsamples']} samples in {len(info['shardlist'])} shards")
    print(
        f"classes: {len(document['classes'])} ({document['layout']} layout); "
        f"shards already complete and kept: {document['resumed_shards']}"
    )
    if document["reencoded"]:
        print(f"re-encoded as RGB JPEG: {len(document['reencoded'])}")
        for item in document["reencoded"][: args.list]:
            print(f"  {visible(item['source'])}: {visible(item['reason'])}")
    if document["skipped"]:
        print(f"skipped (not usable): {len(document['skipped'])}")
        for item in document["skipped"][: args.list]:
            print(f"  {visible(item['source'])}: {visible(item['reason'])}")
    links = document["outside_links"]
    if links:
        print(f"symlinks leading out of {args.source}, not followed (--follow-symlinks reads them): {len(links)}")
        for link in links[: args.list]:
            print(f"  {visible(link)} -> {visible(os.path.realpath(link))}")  # names from the source tree
    print(f"index: {args.output.rstrip('/')}/shards.json")
    return 0


def cmd_summarize(args: argparse.Namespace) -> int:
    """Print an index's classes and, per split, its samples, shards and shard URLs in brace notation."""
    from imagenet_train.datasets.source import brace, load_index

    index = load_index(args.location, io_timeout=args.io_timeout, trust_index=args.trust_index)
    splits: dict[str, dict[str, Any]] = {}
    for split in index.splits():
        names = [shard["url"] for shard in index.shards(split)]
        splits[split] = {"shards": len(names), "samples": index.nsamples(split), "urls": brace(names)}
    if args.json:
        print(json.dumps({"index": index.location, "classes": len(index.classes), "splits": splits}, indent=1))
        return 0
    print(f"{index.location}: {len(index.classes)} classes")
    for split, info in splits.items():
        print(f"{split}: {info['samples']} samples in {info['shards']} shards: {' '.join(info['urls'])}")
    return 0


def cmd_demo_data(args: argparse.Namespace) -> int:
    """Write the digits dataset as ImageNet-layout JPEGs and print how many images each split got."""
    from imagenet_train.datasets.digits import write_digits

    counts = write_digits(args.output, size=args.size, seed=args.seed)
    print(f"wrote {counts['train']} train and {counts['val']} val images to {args.output}")
    return 0


def cmd_fashion_mnist(args: argparse.Namespace) -> int:
    """Write Fashion-MNIST as ImageNet-layout JPEGs (val/ held out or the test set) and print the counts."""
    from imagenet_train.datasets.fashion_mnist import write_fashion_mnist

    counts = write_fashion_mnist(
        args.output,
        source=args.source,
        holdout=args.holdout,
        train_size=args.train_size,
        val_from=ValFrom(args.val_from),
        size=args.size,
        seed=args.seed,
        progress=not args.quiet,
    )
    what = "the test set" if args.val_from == "test" else "held out of the train set"
    print(f"wrote {counts['train']} train and {counts['val']} val images ({what}) to {args.output}")
    return 0


COMMANDS = (
    Command("shards", "convert a dataset into shards + index", ShardsOptions, cmd_shards),
    Command("summarize", "brace notation and counts", SummarizeOptions, cmd_summarize),
    Command(
        "demo-data", "write scikit-learn's digits as an ImageNet-layout JPEG dataset", DemoDataOptions, cmd_demo_data
    ),
    Command(
        "fashion-mnist",
        "write Fashion-MNIST (Debian's dataset-fashion-mnist) as an ImageNet-layout JPEG dataset",
        FashionMnistOptions,
        cmd_fashion_mnist,
    ),
)
