"""the plan command: the planner's table and verdict, and --simulate over the real loaders"""

from __future__ import annotations

import argparse
import dataclasses
import json

from imagenet_train.config import declaration
from imagenet_train.declarations import add_flag, number
from imagenet_train.errors import ImagenetTrainError, clip

# The training settings plan takes: flags given win over --config FILE, which wins over the declared defaults.
PLAN_SETTINGS = (
    "shards",
    "trust_index",
    "workers",
    "batch_size",
    "mode",
    "epoch_batches",
    "repeat",
    "seed",
    "opt",
    "warmup_epochs",
    "verify_shards",
)


def _settings(args: argparse.Namespace) -> None:
    """Fill each training setting plan takes: the flag given, else the --config file's value, else the default.

    A --config FILE that sets global_batch_size (a recipe) gives each of the planned ranks its share (of each
    loader step, when it sets grad_accum_steps too)."""
    from imagenet_train.config import defaults
    from imagenet_train.config_files import load_settings

    chosen = load_settings(args.config_file) if args.config_file else {}
    default = defaults()
    for name in PLAN_SETTINGS:
        if not hasattr(args, name):
            setattr(args, name, chosen.get(name, default[name]))
    total, world = chosen.get("global_batch_size", 0), args.nodes * args.gpus_per_node
    accumulate = chosen.get("grad_accum_steps", 1)  # the global batch is the optimizer's (Config.for_world)
    if total and "batch_size" not in args.given:
        if total % (world * accumulate):
            raise ImagenetTrainError(
                f"--config {args.config_file}: global_batch_size {total} does not divide over {world} ranks "
                f"(--nodes x --gpus-per-node) x {accumulate} grad_accum_steps; expected a multiple of "
                f"{world * accumulate}"
            )
        args.batch_size = total // (world * accumulate)


def _plan_setup(args: argparse.Namespace) -> None:
    """The planner's Setup from an index, a list of sizes or a count (stored on `args`)."""
    from imagenet_train.planning import plan

    args.given = {name for name in PLAN_SETTINGS if hasattr(args, name)}
    _settings(args)

    urls: list[str] = []
    args.expected = {}
    if args.shards:
        from imagenet_train.datasets.index import load_index

        index = load_index(args.shards, trust_index=args.trust_index)
        sizes, urls = index.sizes("train"), index.urls("train")
        if args.simulate and args.verify_shards:
            from imagenet_train.datasets.source import expected_shards

            args.expected = expected_shards(index, ["train"])
    elif args.shard_sizes:
        try:
            sizes = [int(size) for size in args.shard_sizes.split(",")]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) < 1:
            raise ImagenetTrainError(
                f"--shard-sizes: expected whole numbers >= 1 like 1000,1000,640, got '{clip(args.shard_sizes)}'"
            )
    elif args.nshards and args.samples_per_shard:
        sizes = [args.samples_per_shard] * args.nshards
    else:
        raise ImagenetTrainError("plan: give --shards INDEX, --shard-sizes, or --nshards with --samples-per-shard")
    setup = plan.Setup.of(
        args, args.seed, sizes, nodes=args.nodes, gpus_per_node=args.gpus_per_node, join=args.join, epoch=args.epoch
    )
    args.setup = (setup, urls)


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the plan and its verdict (checked against the real loaders with --simulate); 1 on a hang or mismatch."""
    from imagenet_train.planning import plan
    from imagenet_train.planning.optimization import large_batch_advice

    setup, urls = args.setup
    assessment = plan.assess(setup)
    advice = large_batch_advice(args.opt, setup.batch_size * setup.world, args.warmup_epochs)
    simulated = None
    if args.simulate:
        if not urls:
            raise ImagenetTrainError("--simulate reads the real shards: give --shards INDEX")
        from imagenet_train.loading.simulate import simulate

        simulated = simulate(urls, setup, args.expected)
    if setup.mode is plan.Mode.QUEUE:  # per-rank shares are dynamic: check that every sample was read once
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
        document["advice"] = [advice] if advice else []
        if simulated is not None:
            document["simulated"] = [dataclasses.asdict(s) for s in simulated]
            document["mismatches"] = mismatches
        print(json.dumps(document, indent=1))
    else:
        print(plan.format_assessment(assessment, show_workers=args.show_workers))
        if advice:
            print(f"advice: {advice}")
        if simulated is not None:
            for s in simulated:
                if args.show_open:
                    for worker, opened in enumerate(s.opened):
                        names = [url.rsplit("/", 1)[-1] for url in opened]
                        print(f"  rank {s.rank} worker {worker} opened: {' '.join(names) or '-'}")
            agreed = (
                f"the queue handed out every sample exactly once over {setup.world} ranks"
                if setup.mode is plan.Mode.QUEUE
                else f"the real loaders gave exactly the planned batches on all {setup.world} ranks"
            )
            print("simulation: " + ("; ".join(mismatches) if mismatches else agreed))
    return 1 if assessment.hangs or mismatches else 0


def _add_setting(parser: argparse.ArgumentParser, name: str, context: str = "") -> None:
    """A training setting's flag as `train` takes it (type, range, help and default from config.py)."""
    add_flag(parser, *declaration(name), context=context)


def add_commands(commands: argparse._SubParsersAction, formatter: type) -> None:
    """Add the plan command to the CLI."""
    planner = commands.add_parser(
        "plan",
        formatter_class=formatter,
        help="show how shards split over nodes x GPUs x workers and whether every rank gets the same batches",
    )
    # Training settings come from their declarations; the rest describe the launch being planned.
    planner.add_argument(
        "--config",
        dest="config_file",
        default="",
        help="YAML or JSON file of training settings, as `train --config` takes it (a recipe); flags given win",
    )
    _add_setting(planner, "shards")
    _add_setting(planner, "trust_index")
    planner.add_argument("--shard-sizes", default="", help="samples per shard, comma-separated (instead of an index)")
    planner.add_argument(
        "--nshards", type=number(int, 0, 10_000_000), default=0, help="number of shards (with --samples-per-shard)"
    )
    planner.add_argument(
        "--samples-per-shard", type=number(int, 0, 10_000_000), default=0, help="samples in every shard"
    )
    planner.add_argument("--nodes", type=number(int, 1, 100_000), default=1, help="nodes")
    planner.add_argument("--gpus-per-node", type=number(int, 1, 1024), default=1, help="ranks per node")
    for name in ("workers", "batch_size", "mode", "epoch_batches", "repeat"):
        _add_setting(planner, name)
    planner.add_argument(
        "--join",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="split mode: the step runs under Join (imagenet-train train always does)",
    )
    _add_setting(planner, "seed")
    _add_setting(planner, "opt", context="for the large-batch advice: ")
    _add_setting(planner, "warmup_epochs", context="for the large-batch advice: ")
    planner.add_argument("--epoch", type=number(int, 0, 1_000_000), default=0, help="which epoch's shard order to show")
    planner.add_argument("--show-workers", action="store_true", help="list the shards of every worker")
    planner.add_argument("--simulate", action="store_true", help="run the real loaders over the real shards")
    planner.add_argument("--show-open", action="store_true", help="with --simulate: shards each worker opened")
    _add_setting(planner, "verify_shards", context="with --simulate: ")
    planner.add_argument("--json", action="store_true", help="machine-readable output")
    planner.set_defaults(func=cmd_plan, check=_plan_setup)
