"""the dataset commands: shards, summarize, demo-data, fashion-mnist"""

from __future__ import annotations

import argparse
import json
import os

from imagenet_train.config import declaration
from imagenet_train.datasets.pixels import MAX_IMAGE_PIXELS
from imagenet_train.declarations import add_flag, choice, number, text


def cmd_shards(args: argparse.Namespace) -> int:
    """Convert a dataset into shards and their index, and report what was kept, skipped or re-encoded."""
    from imagenet_train.datasets.convert import ShardOptions, convert

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
    if output.startswith("gs://"):
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
            print(f"  {item['source']}: {item['reason']}")
    if document["skipped"]:
        print(f"skipped (not usable): {len(document['skipped'])}")
        for item in document["skipped"][: args.list]:
            print(f"  {item['source']}: {item['reason']}")
    links = document["outside_links"]
    if links:
        print(f"symlinks leading out of {args.source}, not followed (--follow-symlinks reads them): {len(links)}")
        for link in links[: args.list]:
            print(f"  {link} -> {os.path.realpath(link)}")
    print(f"index: {args.output.rstrip('/')}/shards.json")
    return 0


def cmd_summarize(args: argparse.Namespace) -> int:
    """Print an index's classes and, per split, its samples, shards and shard URLs in brace notation."""
    from imagenet_train.datasets.index import brace, load_index

    index = load_index(args.location, trust_index=args.trust_index)
    summary = {"index": index.location, "classes": len(index.classes), "splits": {}}
    for split in index.splits():
        names = [shard["url"] for shard in index.shards(split)]
        summary["splits"][split] = {"shards": len(names), "samples": index.nsamples(split), "urls": brace(names)}
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"{index.location}: {summary['classes']} classes")
    for split, info in summary["splits"].items():
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
    from imagenet_train.datasets.fashion_mnist import ValFrom, write_fashion_mnist

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


def add_commands(commands: argparse._SubParsersAction, formatter: type) -> None:
    """Add the dataset commands to the CLI."""
    count = number(int, 0)
    shards = commands.add_parser("shards", formatter_class=formatter, help="convert a dataset into shards + index")
    shards.add_argument(
        "source", type=text, help="ImageFolder tree, Kaggle layout, or directory with the ILSVRC2012 tars"
    )
    shards.add_argument("output", type=text, help="directory (or gs://BUCKET/PREFIX) for the shards and shards.json")
    shards.add_argument("--staging", default=None, help="with a gs:// output: local directory to write to first")
    shards.add_argument("--prefix", type=text, default="imagenet-train", help="shard name prefix")
    shards.add_argument("--maxcount", type=number(int, 1, 10_000_000), default=1000, help="samples per shard at most")
    shards.add_argument(
        "--maxsize", type=number(int, 1 << 20, 1 << 40), default=3_000_000_000, help="bytes per shard at most (approx.)"
    )
    shards.add_argument("--workers", type=number(int, 1, 512), default=1, help="parallel shard writers")
    shards.add_argument(
        "--seed", type=number(int, 0, 2**63 - 1), default=0, help="seed of the sample shuffle across shards"
    )
    shards.add_argument(
        "--resize", type=number(int, 0, 16384), default=0, help="re-encode images with a larger short side (0: keep)"
    )
    shards.add_argument("--quality", type=number(int, 1, 100), default=90, help="JPEG quality when re-encoding")
    shards.add_argument(
        "--verify",
        default="full",
        type=choice("full", "header"),
        help="full: decode every image (catches any corruption); header: header and end marker (I/O speed)",
    )
    shards.add_argument(
        "--max-image-pixels",
        type=number(int, 0, 1 << 32),
        default=MAX_IMAGE_PIXELS,
        help="skip (and list) images whose header claims more pixels than this, before decoding them (0: no cap)",
    )
    shards.add_argument("--val-labels", default=None, help="LOC_val_solution.csv or '<file> <wnid>' lines")
    shards.add_argument("--list", type=count, default=20, help="skipped/re-encoded files to list")
    shards.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="read images through symlinks that lead out of the source tree (by default they are skipped and listed)",
    )
    shards.add_argument("--quiet", action="store_true", help="no progress bar")
    shards.set_defaults(func=cmd_shards)

    summarize = commands.add_parser("summarize", formatter_class=formatter, help="brace notation and counts")
    summarize.add_argument("location", type=text, help="shard directory, shards.json, or a URL to either")
    summarize.add_argument("--json", action="store_true", help="machine-readable output")
    add_flag(summarize, *declaration("trust_index"), given_only=False)
    summarize.set_defaults(func=cmd_summarize)

    demo = commands.add_parser(
        "demo-data", formatter_class=formatter, help="write scikit-learn's digits as an ImageNet-layout JPEG dataset"
    )
    demo.add_argument("output", type=text, help="directory for train/ and val/")
    demo.add_argument("--size", type=number(int, 8, 4096), default=64, help="image side in pixels")
    demo.add_argument("--seed", type=number(int, 0, 2**32 - 1), default=0, help="seed of the train/val split")
    demo.set_defaults(func=cmd_demo_data)

    from imagenet_train.datasets.fashion_mnist import DEBIAN_SOURCE, ValFrom

    fashion = commands.add_parser(
        "fashion-mnist",
        formatter_class=formatter,
        help="write Fashion-MNIST (Debian's dataset-fashion-mnist) as an ImageNet-layout JPEG dataset",
    )
    fashion.add_argument("output", type=text, help="new directory for train/, val/ and fashion-mnist.json")
    fashion.add_argument(
        "--source", type=text, default=DEBIAN_SOURCE, help="folder with the four idx files (.gz or raw)"
    )
    fashion.add_argument(
        "--val-from",
        type=choice(*(v.value for v in ValFrom)),
        default=ValFrom.HOLDOUT.value,
        help="what val/ holds: holdout (--holdout images kept out of the 60,000 train images, for tuning) or test "
        "(the 10,000 test images, for reported figures only; train/ then draws on all 60,000)",
    )
    fashion.add_argument(
        "--holdout",
        type=number(int, 0, 60_000),
        default=5000,
        help="with --val-from holdout: train images held out as val/, the same number per class",
    )
    fashion.add_argument(
        "--train-size",
        type=number(int, 0, 60_000),
        default=0,
        help="class-balanced subset of the remaining train images to write (0: all of them)",
    )
    fashion.add_argument("--size", type=number(int, 8, 4096), default=28, help="image side in pixels (bicubic)")
    fashion.add_argument("--seed", type=number(int, 0, 2**32 - 1), default=0, help="seed of the holdout and subset")
    fashion.add_argument("--quiet", action="store_true", help="no progress bar")
    fashion.set_defaults(func=cmd_fashion_mnist)
