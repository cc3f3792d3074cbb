"""the plan command: the planner's table and verdict, and --simulate over the real loaders"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from imagenet_train.choices import Mode
from imagenet_train.commands import Command, one_shot_io_timeout, training
from imagenet_train.declarations import option
from imagenet_train.errors import ImagenetTrainError, clip

if TYPE_CHECKING:
    from imagenet_train.loading.simulate import SimulatedRank
    from imagenet_train.planning import plan

ADVICE = "for the large-batch advice: "
SIMULATE = "with --simulate: "


@dataclass
class PlanOptions:
    """`imagenet-train plan`: training settings come from their declarations; the rest describe the launch."""

    config_file: str = option(
        "",
        "YAML or JSON file of training settings, as `train --config` takes it (a recipe); flags given win",
        flags=("--config",),
    )
    shards: str = training("shards")
    trust_index: bool = training("trust_index")
    io_timeout: float = one_shot_io_timeout()
    shard_sizes: str = option("", "samples per shard, comma-separated (instead of an index)")
    nshards: int = option(0, "number of shards (with --samples-per-shard)", minimum=0, maximum=10_000_000)
    samples_per_shard: int = option(0, "samples in every shard", minimum=0, maximum=10_000_000)
    nodes: int = option(1, "nodes", minimum=1, maximum=100_000)
    gpus_per_node: int = option(1, "ranks per node", minimum=1, maximum=1024)
    workers: int = training("workers")
    batch_size: int = training("batch_size")
    mode: str = training("mode")
    epoch_batches: int = training("epoch_batches")
    repeat: int = training("repeat")
    join: bool = option(True, "split mode: the step runs under Join (imagenet-train train always does)", negatable=True)
    seed: int = training("seed")
    opt: str = training("opt", context=ADVICE)
    warmup_epochs: float = training("warmup_epochs", context=ADVICE)
    epoch: int = option(0, "which epoch's shard order to show", minimum=0, maximum=1_000_000)
    show_workers: bool = option(False, "list the shards of every worker")
    simulate: bool = option(False, "run the real loaders over the real shards")
    show_open: bool = option(False, "with --simulate: shards each worker opened")
    verify_shards: bool = training("verify_shards", context=SIMULATE)
    json: bool = option(False, "machine-readable output")


# The training settings plan takes: flags given win over --config FILE, which wins over the declared defaults.
PLAN_SETTINGS = tuple(f.name for f in dataclasses.fields(PlanOptions) if "setting" in f.metadata)


def _settings(args: argparse.Namespace) -> None:
    """Fill each training setting plan takes: the flag given, else the --config file's value, else the default.

    A --config FILE that sets global_batch_size (a recipe) gives each of the planned ranks its share (of each
    loader step, when it sets grad_accum_steps too)."""
    from imagenet_train.config import defaults
    from imagenet_train.config_files import load_settings

    chosen = load_settings(args.config_file, args.given) if args.config_file else {}
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
        from imagenet_train.datasets.source import load_index

        index = load_index(args.shards, io_timeout=args.io_timeout, trust_index=args.trust_index)
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


def _mismatches(setup: plan.Setup, assessment: plan.Assessment, simulated: list[SimulatedRank] | None) -> list[str]:
    """Where the real loaders disagreed with the plan (nothing without --simulate)."""

    if setup.mode is Mode.QUEUE:  # per-rank shares are dynamic: check that every sample was read once
        got = sum(s.samples for s in simulated or [])
        if simulated and got != sum(setup.shard_sizes):
            return [f"the queue gave {got} samples of {sum(setup.shard_sizes)}"]
        return []
    return [
        f"rank {s.rank}: planned {r.batches} batches, loader gave {s.batches}"
        for r, s in zip(assessment.ranks, simulated or [], strict=False)
        if r.batches != s.batches
    ]


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the plan and its verdict (--simulate: checked against the real loaders); 1 on WILL HANG, REFUSED or a
    mismatch."""
    from imagenet_train.planning import plan
    from imagenet_train.planning.plan_table import format_assessment
    from imagenet_train.planning.schedule import large_batch_advice

    setup, urls = args.setup
    assessment = plan.assess(setup)
    advice = large_batch_advice(args.opt, setup.batch_size * setup.world, args.warmup_epochs)
    simulated = None
    if args.simulate:
        if not urls:
            raise ImagenetTrainError("--simulate reads the real shards: give --shards INDEX")
        from imagenet_train.loading.simulate import simulate

        simulated = simulate(urls, setup, args.expected)
    mismatches = _mismatches(setup, assessment, simulated)
    if args.json:
        document = dataclasses.asdict(assessment)
        document["advice"] = [advice] if advice else []
        if simulated is not None:
            document["simulated"] = [dataclasses.asdict(s) for s in simulated]
            document["mismatches"] = mismatches
        print(json.dumps(document, indent=1))
    else:
        print(format_assessment(assessment, show_workers=args.show_workers))
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
                if setup.mode is Mode.QUEUE
                else f"the real loaders gave exactly the planned batches on all {setup.world} ranks"
            )
            print("simulation: " + ("; ".join(mismatches) if mismatches else agreed))
    return 1 if assessment.fails or mismatches else 0


COMMANDS = (
    Command(
        "plan",
        "show how shards split over nodes x GPUs x workers and whether every rank gets the same batches",
        PlanOptions,
        cmd_plan,
        check=_plan_setup,
    ),
)
