"""`imagenet-train <command>`: parses options and dispatches; the work lives in the other modules."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import time

from .errors import ImagenetTrainError, one_line

HELP = {
    "shards": "shard index (shards.json), its directory, or an http(s):// URL to either",
    "train_urls": "training shards as a URL spec instead of an index, e.g. 'http://host/x-{000000..000146}.tar'",
    "val_urls": "validation shards as a URL spec (with --train-urls)",
    "train_samples": "samples in --train-urls (sets the epoch length)",
    "num_classes": "classes (0: from the index)",
    "decoder": "train-time JPEG decoder: simplejpeg (decode, then crop the uint8 image), fused (crop and "
    "DCT-scale inside libjpeg-turbo via PyTurboJPEG; needs libturbojpeg) or pil",
    "mode": "resampled: shards drawn at random, equal batches per rank; split: every sample once, under Join; "
    "queue: every sample once, shards handed out at run time to whichever rank is free",
    "batch_size": "batch size per rank",
    "workers": "DataLoader workers per rank",
    "image_size": "training and evaluation crop size",
    "val_resize": "evaluation resize of the short side before the centre crop (0: size/0.875)",
    "min_crop_scale": "smallest image area fraction RandomResizedCrop keeps",
    "hflip": "random horizontal flips",
    "shuffle_buffer": "samples in each shuffle buffer",
    "epoch_batches": "batches per rank per epoch (0: one pass over the data; split mode: cut every rank here)",
    "repeat": "split mode: each worker reads its shards this many times per epoch (with --epoch-batches)",
    "cache_dir": "node-local directory to keep copies of remote shards in, so later epochs read local disk",
    "retries": "attempts to reach a shard server before failing",
    "loader_timeout": "seconds without a batch from the DataLoader workers before failing (0: wait forever)",
    "lr": "learning rate for a global batch of 256 (scaled linearly)",
    "momentum": "SGD momentum",
    "nesterov": "Nesterov momentum",
    "weight_decay": "weight decay (not applied to biases and norms)",
    "label_smoothing": "label smoothing",
    "warmup_epochs": "linear warmup before the cosine decay",
    "arch": "torchvision model name",
    "epochs": "epochs to train",
    "amp": "mixed precision: auto (bf16 on GPU, off on CPU), bf16, fp16, off",
    "channels_last": "channels-last memory format on GPU",
    "seed": "seed for weights, shard order and augmentation",
    "run_dir": "directory for config.json, metrics.jsonl and checkpoints",
    "results": "gs://BUCKET/PREFIX to mirror the run directory to as training goes (and resume from)",
    "resume": "'latest' (newest checkpoint in --run-dir) or a checkpoint path",
    "checkpoint_every": "also checkpoint every N batches inside an epoch, for mid-epoch resume (0: epoch ends only)",
    "eval_every": "evaluate every N epochs (and after the last)",
    "total_samples": "train for this many samples instead of --epochs (resampled mode; evaluation, checkpoints "
    "and metrics every --epoch-batches batches)",
    "force": "run even when the pre-flight check says the configuration will hang",
    "log_keys": "debug: record every sample key read, per rank and epoch, under RUN_DIR/keys",
}


def _add_dataclass_options(parser: argparse.ArgumentParser, instance) -> None:
    group = parser.add_argument_group(type(instance).__name__.removesuffix("Config").lower() or "options")
    for field in dataclasses.fields(instance):
        flag = "--" + field.name.replace("_", "-")
        default = getattr(instance, field.name)
        if isinstance(default, bool):
            group.add_argument(
                flag,
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=default,
                help=HELP.get(field.name, ""),
            )
        else:
            group.add_argument(
                flag, dest=field.name, type=type(default), default=default, help=HELP.get(field.name, "")
            )


def _config_from(args: argparse.Namespace):
    from .config import Config

    cfg = Config()
    for section in (cfg.data, cfg.optim, cfg.run):
        for field in dataclasses.fields(section):
            setattr(section, field.name, getattr(args, field.name))
    return cfg


def cmd_shards(args: argparse.Namespace) -> int:
    from .shards import ShardOptions, convert

    options = ShardOptions(
        prefix=args.prefix,
        maxcount=args.maxcount,
        maxsize=args.maxsize,
        workers=args.workers,
        seed=args.seed,
        resize=args.resize or None,
        quality=args.quality,
        verify=args.verify,
    )
    output = args.output
    if output.startswith("gs://"):
        # Shards are written locally first (resumable there with --staging), then uploaded and verified.
        import tempfile

        output = args.staging or tempfile.mkdtemp(prefix="imagenet-train-shards-")
    document = convert(args.source, output, options, val_labels=args.val_labels, progress=not args.quiet)
    if output != args.output:
        from .transfer import upload_tree

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
    print(f"index: {args.output.rstrip('/')}/shards.json")
    return 0


def cmd_summarize(args: argparse.Namespace) -> int:
    from .index import brace, load_index

    index = load_index(args.location)
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


def cmd_probe(args: argparse.Namespace) -> int:
    from .probe import probe, wait_for

    result = wait_for(args.location, args.wait, split=args.split) if args.wait else probe(args.location, args.split)
    print(
        f"{result.index}: {result.samples} {args.split} samples in {result.shards} shards; "
        f"read {result.shard} ({result.shard_bytes} bytes, {result.shard_samples} samples)",
        flush=True,
    )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from .train import train

    train(_config_from(args))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import NginxServer

    with NginxServer(
        args.directory, host=args.host, port=args.port, workers=args.nginx_workers, access_log=args.access_log
    ) as server:
        print(f"serving {server.root} at {server.url}/ (nginx pid {server.pid}); Ctrl-C stops", flush=True)
        if args.pid_file:
            with open(args.pid_file, "w") as stream:
                stream.write(f"{os.getpid()}\n")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            while server.process.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


def cmd_demo_data(args: argparse.Namespace) -> int:
    from .demo import write_digits

    counts = write_digits(args.output, size=args.size, seed=args.seed)
    print(f"wrote {counts['train']} train and {counts['val']} val images to {args.output}")
    return 0


def _plan_setup(args: argparse.Namespace):
    from . import plan

    urls: list[str] = []
    if args.shards:
        from .index import load_index

        index = load_index(args.shards)
        sizes, urls = index.sizes("train"), index.urls("train")
    elif args.shard_sizes:
        try:
            sizes = [int(size) for size in args.shard_sizes.split(",")]
        except ValueError:
            raise ImagenetTrainError(
                f"--shard-sizes: expected numbers like 1000,1000,640, got '{args.shard_sizes}'"
            ) from None
    elif args.nshards and args.samples_per_shard:
        sizes = [args.samples_per_shard] * args.nshards
    else:
        raise ImagenetTrainError("plan: give --shards INDEX, --shard-sizes, or --nshards with --samples-per-shard")
    setup = plan.Setup(
        shard_sizes=tuple(sizes),
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        workers=args.workers,
        batch_size=args.batch_size,
        mode=args.mode,
        epoch_batches=args.epoch_batches,
        repeat=args.repeat,
        join=args.join,
        seed=args.seed,
        epoch=args.epoch,
    )
    return setup, urls


def cmd_plan(args: argparse.Namespace) -> int:
    from . import plan

    setup, urls = _plan_setup(args)
    assessment = plan.assess(setup)
    simulated = None
    if args.simulate:
        if not urls:
            raise ImagenetTrainError("--simulate reads the real shards: give --shards INDEX")
        from .simulate import simulate

        simulated = simulate(urls, setup)
    if setup.mode == "queue":  # per-rank shares are dynamic: check that every sample was read once
        got = sum(s.samples for s in simulated or [])
        mismatches = (
            [f"the queue gave {got} samples of {sum(setup.shard_sizes)}"]
            if simulated and got != sum(setup.shard_sizes)
            else []
        )
    else:
        mismatches = [
            f"rank {s.rank}: planned {r.batches} batches, loader gave {s.batches}"
            for r, s in zip(assessment.ranks, simulated or [], strict=False)
            if r.batches != s.batches
        ]
    if args.json:
        document = dataclasses.asdict(assessment)
        if simulated is not None:
            document["simulated"] = [dataclasses.asdict(s) for s in simulated]
            document["mismatches"] = mismatches
        print(json.dumps(document, indent=1))
    else:
        print(plan.format_assessment(assessment, show_workers=args.show_workers))
        if simulated is not None:
            for s in simulated:
                if args.show_open:
                    for worker, opened in enumerate(s.opened):
                        names = [url.rsplit("/", 1)[-1] for url in opened]
                        print(f"  rank {s.rank} worker {worker} opened: {' '.join(names) or '-'}")
            agreed = (
                f"the queue handed out every sample exactly once over {setup.world} ranks"
                if setup.mode == "queue"
                else f"the real loaders gave exactly the planned batches on all {setup.world} ranks"
            )
            print("simulation: " + ("; ".join(mismatches) if mismatches else agreed))
    return 1 if assessment.verdict.startswith("WILL HANG") or mismatches else 0


def _transfer(copies, copy, args: argparse.Namespace, verb: str) -> int:
    from .transfer import run

    todo = [c for c in copies if c.action == "copy"]
    size = sum(c.size for c in todo)
    if args.dry_run:
        for item in copies:
            print(f"{item.action:4} {item.source} -> {item.target}")
    else:
        run(copies, copy, args.workers)
    done = "would copy" if args.dry_run else verb
    kept = len(copies) - len(todo)
    print(f"{done} {len(todo)} files ({size / 1e6:.1f} MB), {kept} already there with the same checksum")
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    from . import gcs
    from .transfer import plan_upload

    return _transfer(plan_upload(args.directory, args.url), gcs.upload, args, "uploaded and verified")


def cmd_sync(args: argparse.Namespace) -> int:
    from . import gcs
    from .transfer import plan_sync

    return _transfer(plan_sync(args.url, args.directory), gcs.download, args, "downloaded and verified")


def cmd_launch(args: argparse.Namespace) -> int:
    from .launch import run

    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if args.wait_for and not args.dry_run:
        from .probe import wait_for

        result = wait_for(args.wait_for, args.wait_timeout)
        print(f"shards ready: {result.index} ({result.samples} train samples in {result.shards} shards)", flush=True)
    return run(program, nproc=args.nproc_per_node, dry_run=args.dry_run)


def build_parser() -> argparse.ArgumentParser:
    from .config import DataConfig, OptimConfig, RunConfig

    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(
        prog="imagenet-train",
        formatter_class=formatter,
        description="ImageNet to WebDataset shards to multinode DDP training.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    shards = commands.add_parser("shards", formatter_class=formatter, help="convert a dataset into shards + index")
    shards.add_argument("source", help="ImageFolder tree, Kaggle layout, or directory with the ILSVRC2012 tars")
    shards.add_argument("output", help="directory (or gs://BUCKET/PREFIX) for the shards and shards.json")
    shards.add_argument("--staging", default=None, help="with a gs:// output: local directory to write to first")
    shards.add_argument("--prefix", default="imagenet-train", help="shard name prefix")
    shards.add_argument("--maxcount", type=int, default=1000, help="samples per shard at most")
    shards.add_argument("--maxsize", type=int, default=3_000_000_000, help="bytes per shard at most (approx.)")
    shards.add_argument("--workers", type=int, default=1, help="parallel shard writers")
    shards.add_argument("--seed", type=int, default=0, help="seed of the sample shuffle across shards")
    shards.add_argument("--resize", type=int, default=0, help="re-encode images with a larger short side (0: keep)")
    shards.add_argument("--quality", type=int, default=90, help="JPEG quality when re-encoding")
    shards.add_argument(
        "--verify",
        default="full",
        choices=["full", "header"],
        help="full: decode every image (catches any corruption); header: header and end marker (I/O speed)",
    )
    shards.add_argument("--val-labels", default=None, help="LOC_val_solution.csv or '<file> <wnid>' lines")
    shards.add_argument("--list", type=int, default=20, help="skipped/re-encoded files to list")
    shards.add_argument("--quiet", action="store_true", help="no progress bar")
    shards.set_defaults(func=cmd_shards)

    summarize = commands.add_parser("summarize", formatter_class=formatter, help="brace notation and counts")
    summarize.add_argument("location", help="shard directory, shards.json, or a URL to either")
    summarize.add_argument("--json", action="store_true", help="machine-readable output")
    summarize.set_defaults(func=cmd_summarize)

    probe = commands.add_parser(
        "probe", formatter_class=formatter, help="check a shard source: fetch the index and read one shard"
    )
    probe.add_argument("location", help="index (shards.json), its directory, or a URL to either")
    probe.add_argument("--split", default="train", help="split whose first shard is read")
    probe.add_argument("--wait", type=float, default=0, help="retry for up to this many seconds (0: once)")
    probe.set_defaults(func=cmd_probe)
    train = commands.add_parser("train", formatter_class=formatter, help="train (run under torchrun for DDP)")
    for section in (DataConfig(), OptimConfig(), RunConfig()):
        _add_dataclass_options(train, section)
    train.set_defaults(func=cmd_train)

    serve = commands.add_parser("serve", formatter_class=formatter, help="serve a shard directory with nginx")
    serve.add_argument("directory", help="directory holding the shards and shards.json")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8080, help="port (0: a free one)")
    serve.add_argument("--nginx-workers", type=int, default=2, help="nginx worker processes")
    serve.add_argument("--access-log", action="store_true", help="keep an access log")
    serve.add_argument("--pid-file", default=None, help="write this command's pid here")
    serve.set_defaults(func=cmd_serve)

    planner = commands.add_parser(
        "plan",
        formatter_class=formatter,
        help="show how shards split over nodes x GPUs x workers and whether every rank gets the same batches",
    )
    planner.add_argument("--shards", default="", help="shard index (shards.json), its directory, or a URL")
    planner.add_argument("--shard-sizes", default="", help="samples per shard, comma-separated (instead of an index)")
    planner.add_argument("--nshards", type=int, default=0, help="number of shards (with --samples-per-shard)")
    planner.add_argument("--samples-per-shard", type=int, default=0, help="samples in every shard")
    planner.add_argument("--nodes", type=int, default=1, help="nodes")
    planner.add_argument("--gpus-per-node", type=int, default=1, help="ranks per node")
    planner.add_argument("--workers", type=int, default=8, help="DataLoader workers per rank")
    planner.add_argument("--batch-size", type=int, default=256, help="batch size per rank")
    planner.add_argument("--mode", default="resampled", help="resampled, split or queue")
    planner.add_argument(
        "--epoch-batches",
        type=int,
        default=0,
        help="batches per rank per epoch (resampled: 0 is one pass; split: a cut, 0 is none)",
    )
    planner.add_argument("--repeat", type=int, default=1, help="split: times each worker reads its shards per epoch")
    planner.add_argument(
        "--join",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="split mode: the step runs under Join (imagenet-train train always does)",
    )
    planner.add_argument("--seed", type=int, default=0, help="seed of the per-epoch shard order")
    planner.add_argument("--epoch", type=int, default=0, help="which epoch's shard order to show")
    planner.add_argument("--show-workers", action="store_true", help="list the shards of every worker")
    planner.add_argument("--simulate", action="store_true", help="run the real loaders over the real shards")
    planner.add_argument("--show-open", action="store_true", help="with --simulate: shards each worker opened")
    planner.add_argument("--json", action="store_true", help="machine-readable output")
    planner.set_defaults(func=cmd_plan)

    upload = commands.add_parser(
        "upload",
        formatter_class=formatter,
        help="copy a run directory (or any directory) to gs://, skipping identical files",
    )
    upload.add_argument("directory", help="local directory, e.g. a run directory")
    upload.add_argument("url", help="gs://BUCKET/PREFIX")
    sync = commands.add_parser(
        "sync",
        formatter_class=formatter,
        help="copy a gs:// prefix to a directory (e.g. to fill a shard-server volume)",
    )
    sync.add_argument("url", help="gs://BUCKET/PREFIX")
    sync.add_argument("directory", help="local directory")
    for transfer, func in ((upload, cmd_upload), (sync, cmd_sync)):
        transfer.add_argument("--workers", type=int, default=8, help="parallel transfers")
        transfer.add_argument("--dry-run", action="store_true", help="list what would be copied or skipped")
        transfer.set_defaults(func=func)

    launch = commands.add_parser(
        "launch",
        formatter_class=formatter,
        help="run torchrun with arguments taken from the launcher's environment (the image's entrypoint)",
        description="Reads NGC, PyTorchJob, TrainJob, JobSet, Indexed Job or plain environments and runs "
        "`torchrun ... -m imagenet_train.cli PROGRAM...`, e.g. `imagenet-train launch -- train --shards URL`.",
    )
    launch.add_argument(
        "--nproc-per-node", default=None, help="processes per node (default: from the environment, else GPUs)"
    )
    launch.add_argument(
        "--wait-for",
        default="",
        metavar="INDEX",
        help="first wait until this shard index and its first shard can be read",
    )
    launch.add_argument("--wait-timeout", type=float, default=1800, help="seconds --wait-for keeps trying")
    launch.add_argument("--dry-run", action="store_true", help="print the torchrun command and exit")
    launch.add_argument("program", nargs=argparse.REMAINDER, help="imagenet-train command and its options")
    launch.set_defaults(func=cmd_launch)

    demo = commands.add_parser(
        "demo-data", formatter_class=formatter, help="write scikit-learn's digits as an ImageNet-layout JPEG dataset"
    )
    demo.add_argument("output", help="directory for train/ and val/")
    demo.add_argument("--size", type=int, default=64, help="image side in pixels")
    demo.add_argument("--seed", type=int, default=0, help="seed of the train/val split")
    demo.set_defaults(func=cmd_demo_data)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `imagenet-train` console script."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ImagenetTrainError as error:
        print(f"imagenet-train: error: {one_line(str(error))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
