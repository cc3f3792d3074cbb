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
from typing import NoReturn

from .errors import ImagenetTrainError, Preempted, one_line
from .settings import choice, converter, declared, expectation, flag, number, text


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error format: one line naming the flag, exit code 2."""

    def error(self, message: str) -> NoReturn:
        message = message.removeprefix("argument ")
        self.exit(2, f"imagenet-train: error: {one_line(message)}\n")


def _add_settings(parser: argparse.ArgumentParser, section) -> None:
    """One flag per declared setting: its type, default, help and range come from the declaration.

    Flags default to absent (SUPPRESS), so a flag given overrides `--config`, which overrides the default.
    """
    group = parser.add_argument_group(type(section).__name__.removesuffix("Config").lower() or "options")
    for declaration, rule in declared(section):
        default = declaration.default
        help_text = rule.help + (f" ({expectation(type(default), rule)})" if rule.choices else "")
        help_text += f" (default: {default})"
        if isinstance(default, bool):
            group.add_argument(
                flag(declaration.name),
                dest=declaration.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            group.add_argument(
                flag(declaration.name),
                dest=declaration.name,
                type=converter(declaration.name, type(default), rule),
                default=argparse.SUPPRESS,
                metavar=declaration.name.upper(),
                help=help_text,
            )


def _config_from(args: argparse.Namespace):
    """Defaults, then the `--config` file's settings, then the flags given."""
    from .config import Config, load_settings

    given = vars(args)
    chosen = load_settings(given["config_file"]) if given.get("config_file") else {}
    cfg = Config()
    for section in cfg.sections():
        for declaration, _ in declared(section):
            name = declaration.name
            setattr(section, name, given.get(name, chosen.get(name, declaration.default)))
    return cfg


def train_config(options: list[str]):
    """The Config that `imagenet-train train OPTIONS...` would run, for other launchers and notebooks."""
    return _config_from(build_parser().parse_args(["train", *options]))


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


def _deployment(path: str) -> dict:
    """The chart's deployment.yaml; its storage environment is applied where the pod's own env is silent."""
    from .config import read_mapping
    from .deployment import WRITABLE_ENV, storage_env

    document = read_mapping(path, "--deployment")
    os.environ.update({**storage_env(document, document["name"]), **os.environ, **WRITABLE_ENV})
    return document


def cmd_probe(args: argparse.Namespace) -> int:
    from .probe import probe, wait_for

    location = args.location
    if args.deployment:
        from .deployment import shards_url

        document = _deployment(args.deployment)
        location = shards_url(document, document["name"])
    if not location:
        raise ImagenetTrainError("probe: give the shard index (LOCATION) or --deployment FILE")
    result = wait_for(location, args.wait, split=args.split) if args.wait else probe(location, args.split)
    print(
        f"{result.index}: {result.samples} {args.split} samples in {result.shards} shards; "
        f"read {result.shard} ({result.shard_bytes} bytes, {result.shard_samples} samples)",
        flush=True,
    )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from .train import train

    train(args.config)
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


def _plan_setup(args: argparse.Namespace) -> None:
    """The planner's Setup from an index, a list of sizes or a count (stored on `args`)."""
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
            sizes = []
        if not sizes or min(sizes) < 1:
            raise ImagenetTrainError(
                f"--shard-sizes: expected whole numbers >= 1 like 1000,1000,640, got '{args.shard_sizes}'"
            )
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
    args.setup = (setup, urls)


def cmd_plan(args: argparse.Namespace) -> int:
    from . import plan

    setup, urls = args.setup
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
        run(copies, copy, args.workers, args.io_timeout)
    done = "would copy" if args.dry_run else verb
    kept = len(copies) - len(todo)
    print(f"{done} {len(todo)} files ({size / 1e6:.1f} MB), {kept} already there with the same checksum")
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    from . import gcs
    from .transfer import plan_upload

    return _transfer(plan_upload(args.directory, args.url, args.io_timeout), gcs.upload, args, "uploaded and verified")


def cmd_sync(args: argparse.Namespace) -> int:
    from . import gcs
    from .transfer import plan_sync

    return _transfer(
        plan_sync(args.url, args.directory, args.io_timeout), gcs.download, args, "downloaded and verified"
    )


def cmd_launch(args: argparse.Namespace) -> int:
    from .launch import run

    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    nproc, wait_for, wait_timeout = args.nproc_per_node, args.wait_for, args.wait_timeout
    if args.deployment:
        from .deployment import plan, pod_environment

        deployment = plan(_deployment(args.deployment))
        os.environ.update(pod_environment(deployment, os.environ))
        nproc = nproc or str(deployment.nproc)
        wait_for, wait_timeout = wait_for or deployment.wait_for, deployment.wait_timeout
        if program[:1] == ["train"]:
            program = [*program, *deployment.train_flags]  # after --config: the deployment's places win
    if wait_for and not args.dry_run:
        from .probe import wait_for as wait_for_shards

        result = wait_for_shards(wait_for, wait_timeout)
        print(f"shards ready: {result.index} ({result.samples} train samples in {result.shards} shards)", flush=True)
    return run(program, nproc=nproc, dry_run=args.dry_run, grace_period=args.grace_period)


def cmd_fill(args: argparse.Namespace) -> int:
    from . import gcs
    from .transfer import plan_sync

    fill = _deployment(args.deployment)["shards"]["nginx"]["fill"]
    args.workers, args.dry_run = int(fill["parallel"]), False
    return _transfer(
        plan_sync(fill["from"], args.directory, args.io_timeout), gcs.download, args, "downloaded and verified"
    )


def cmd_ray(args: argparse.Namespace) -> int:
    from .ray_launch import RayOptions, run

    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if program[:1] != ["train"]:
        raise ImagenetTrainError(
            "ray: expected the training command after the options, e.g. "
            "`imagenet-train ray --workers 2 -- train --shards URL`"
        )
    options = RayOptions(args.address, args.workers, args.gpus, args.max_failures, args.cpus_per_worker)
    last = run(train_config(program[1:]), options)
    top1 = f", top-1 {last['top1']:.4f}" if "top1" in last else ""
    print(f"ray: finished epoch {last['epoch']}{top1}", flush=True)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .report import report

    table, written = report(Path(args.run_dir))
    print(table)
    print(f"plots: {', '.join(str(path) for path in written)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .config import DataConfig, OptimConfig, RunConfig

    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = _Parser(
        prog="imagenet-train",
        formatter_class=formatter,
        description="ImageNet to WebDataset shards to multinode DDP training.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    port, positive, count = number(int, 0, 65535), number(int, 1), number(int, 0)
    seconds = number(float, 0, 7 * 24 * 3600)

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
    shards.add_argument("--val-labels", default=None, help="LOC_val_solution.csv or '<file> <wnid>' lines")
    shards.add_argument("--list", type=count, default=20, help="skipped/re-encoded files to list")
    shards.add_argument("--quiet", action="store_true", help="no progress bar")
    shards.set_defaults(func=cmd_shards)

    summarize = commands.add_parser("summarize", formatter_class=formatter, help="brace notation and counts")
    summarize.add_argument("location", type=text, help="shard directory, shards.json, or a URL to either")
    summarize.add_argument("--json", action="store_true", help="machine-readable output")
    summarize.set_defaults(func=cmd_summarize)

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
    probe.set_defaults(func=cmd_probe)
    train = commands.add_parser("train", formatter_class=formatter, help="train (run under torchrun for DDP)")
    train.add_argument(
        "--config",
        dest="config_file",
        default="",
        metavar="FILE",
        help="YAML or JSON file of settings by name (batch_size: 64), or a run's config.json to repeat it; "
        "flags given override it",
    )
    for section in (DataConfig(), OptimConfig(), RunConfig()):
        _add_settings(train, section)
    train.set_defaults(func=cmd_train, check=_check_train)

    serve = commands.add_parser("serve", formatter_class=formatter, help="serve a shard directory with nginx")
    serve.add_argument("directory", type=text, help="directory holding the shards and shards.json")
    serve.add_argument("--host", type=text, default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=port, default=8080, help="port (0: a free one)")
    serve.add_argument("--nginx-workers", type=number(int, 1, 256), default=2, help="nginx worker processes")
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
    planner.add_argument(
        "--nshards", type=number(int, 0, 10_000_000), default=0, help="number of shards (with --samples-per-shard)"
    )
    planner.add_argument(
        "--samples-per-shard", type=number(int, 0, 10_000_000), default=0, help="samples in every shard"
    )
    planner.add_argument("--nodes", type=number(int, 1, 100_000), default=1, help="nodes")
    planner.add_argument("--gpus-per-node", type=number(int, 1, 1024), default=1, help="ranks per node")
    planner.add_argument("--workers", type=number(int, 0, 512), default=8, help="DataLoader workers per rank")
    planner.add_argument("--batch-size", type=number(int, 1, 1 << 20), default=256, help="batch size per rank")
    planner.add_argument(
        "--mode", type=choice("resampled", "split", "queue"), default="resampled", help="resampled, split or queue"
    )
    planner.add_argument(
        "--epoch-batches",
        type=count,
        default=0,
        help="batches per rank per epoch (resampled: 0 is one pass; split: a cut, 0 is none)",
    )
    planner.add_argument(
        "--repeat", type=positive, default=1, help="split: times each worker reads its shards per epoch"
    )
    planner.add_argument(
        "--join",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="split mode: the step runs under Join (imagenet-train train always does)",
    )
    planner.add_argument("--seed", type=number(int, 0, 2**63 - 1), default=0, help="seed of the per-epoch shard order")
    planner.add_argument("--epoch", type=number(int, 0, 1_000_000), default=0, help="which epoch's shard order to show")
    planner.add_argument("--show-workers", action="store_true", help="list the shards of every worker")
    planner.add_argument("--simulate", action="store_true", help="run the real loaders over the real shards")
    planner.add_argument("--show-open", action="store_true", help="with --simulate: shards each worker opened")
    planner.add_argument("--json", action="store_true", help="machine-readable output")
    planner.set_defaults(func=cmd_plan, check=_plan_setup)

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
        transfer.add_argument(
            "--io-timeout", type=seconds, default=900, help="seconds to wait out a bucket outage before failing"
        )
        transfer.set_defaults(func=func)
    fill = commands.add_parser(
        "fill",
        formatter_class=formatter,
        help="the chart's fill pod: sync shards.nginx.fill.from onto the shard volume at /shards",
    )
    fill.add_argument("--deployment", type=text, required=True, metavar="FILE", help="the chart's deployment.yaml")
    fill.add_argument("--directory", type=text, default="/shards", help="where the shard volume is mounted")
    fill.add_argument(
        "--io-timeout", type=seconds, default=900, help="seconds to wait out a bucket outage before failing"
    )
    fill.set_defaults(func=cmd_fill)

    launch = commands.add_parser(
        "launch",
        formatter_class=formatter,
        help="run torchrun with arguments taken from the launcher's environment (the image's entrypoint)",
        description="Reads NGC, PyTorchJob, TrainJob, JobSet, Indexed Job or plain environments and runs "
        "`torchrun ... -m imagenet_train.cli PROGRAM...`, e.g. `imagenet-train launch -- train --shards URL`. "
        "SIGTERM and SIGUSR1 reach every rank as pre-emption: each finishes its step, rank 0 checkpoints, "
        "and launch exits with 128 + the signal's number.",
    )
    launch.add_argument(
        "--nproc-per-node",
        type=number(int, 1, 1024),
        default=None,
        help="processes per node (default: from the environment, else GPUs)",
    )
    launch.add_argument(
        "--wait-for",
        default="",
        metavar="INDEX",
        help="first wait until this shard index and its first shard can be read",
    )
    launch.add_argument("--wait-timeout", type=seconds, default=1800, help="seconds --wait-for keeps trying")
    launch.add_argument(
        "--grace-period",
        type=number(float, 1, 3600),
        default=80,
        help="seconds the ranks get after SIGTERM/SIGUSR1 to finish their step and checkpoint before SIGKILL "
        "(give the pod a terminationGracePeriodSeconds a little longer)",
    )
    launch.add_argument(
        "--deployment",
        default="",
        metavar="FILE",
        help="the chart's deployment.yaml (its ConfigMap): processes per node, the shards to wait for, the "
        "launcher's environment and the shard and results places for `train`",
    )
    launch.add_argument("--dry-run", action="store_true", help="print the torchrun command and exit")
    launch.add_argument("program", nargs=argparse.REMAINDER, help="imagenet-train command and its options")
    launch.set_defaults(func=cmd_launch)

    from .launcher_commands import add_commands as add_launcher_commands  # ssh, ssh-node, slurm

    add_launcher_commands(commands, formatter)

    demo = commands.add_parser(
        "demo-data", formatter_class=formatter, help="write scikit-learn's digits as an ImageNet-layout JPEG dataset"
    )
    demo.add_argument("output", type=text, help="directory for train/ and val/")
    demo.add_argument("--size", type=number(int, 8, 4096), default=64, help="image side in pixels")
    demo.add_argument("--seed", type=number(int, 0, 2**32 - 1), default=0, help="seed of the train/val split")
    demo.set_defaults(func=cmd_demo_data)

    ray = commands.add_parser(
        "ray",
        formatter_class=formatter,
        help="train on a Ray cluster with Ray Train (needs imagenet-train[ray])",
        description="Runs `train` in N Ray Train workers, one rank each, in the process group Ray sets up; a "
        "worker that dies restarts the group from the newest checkpoint (as --resume latest), e.g. "
        "`imagenet-train ray --workers 2 -- train --shards URL --checkpoint-every 500`.",
    )
    ray.add_argument("--address", default="", help="Ray cluster address (default: RAY_ADDRESS, else a local one)")
    ray.add_argument(
        "--workers", type=number(int, 0, 100_000), default=0, help="workers, one rank each (0: one per GPU Ray sees)"
    )
    ray.add_argument(
        "--gpus", action=argparse.BooleanOptionalAction, default=None, help="GPU workers (default: if Ray sees GPUs)"
    )
    ray.add_argument(
        "--max-failures", type=number(int, 0, 1000), default=3, help="restarts after a worker dies before giving up"
    )
    ray.add_argument(
        "--cpus-per-worker", type=number(float, 0, 4096), default=1.0, help="CPUs Ray reserves for each worker"
    )
    ray.add_argument("program", nargs=argparse.REMAINDER, help="`train` and its options")
    ray.set_defaults(func=cmd_ray)

    report = commands.add_parser(
        "report", formatter_class=formatter, help="PNG plots and a summary table of a run (needs matplotlib)"
    )
    report.add_argument("run_dir", type=text, help="run directory (holds metrics.jsonl); plots go to RUN_DIR/report")
    report.set_defaults(func=cmd_report)
    return parser


def _check_train(args: argparse.Namespace) -> None:
    """The cross-field checks of a training configuration, before anything starts."""
    args.config = _config_from(args).validate()


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed, checked command (tests replace this to observe a normal start)."""
    return args.func(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `imagenet-train` console script: parse, check every option, then dispatch."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        args = build_parser().parse_args(argv)
        check = getattr(args, "check", None)
        if check:
            check(args)
        return dispatch(args)
    except ImagenetTrainError as error:
        print(f"imagenet-train: error: {one_line(str(error))}", file=sys.stderr)
        return 2
    except Preempted as stop:
        return stop.exit_code
    except OSError as error:
        if error.filename is None:
            raise
        # This machine's files (a read-only or full disk): one line naming the path, not a traceback.
        print(f"imagenet-train: error: {error.filename}: {error.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
