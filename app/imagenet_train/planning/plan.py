"""Epoch, shard and batch arithmetic shared by the loaders, the loop and the planner, and the planner's pre-flight
verdict on a run. No torch, no I/O."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from imagenet_train.choices import BATCH_SIZE, EPOCH_BATCHES, REPEAT, SEED, WORKERS, Mode
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.planning.queue_claims import equal_pace_claims

log = logging.getLogger(__name__)


class Verdict(str, Enum):
    """The planner's judgement of a launch."""

    OK = "OK"
    WARN = "WARN"
    HANG = "WILL HANG"
    REFUSE = "REFUSED"  # it would run, but not as configured (a global batch larger than the epoch's samples)

    def __str__(self) -> str:
        return self.value


def assigned(items: Sequence, index: int, count: int) -> list:
    """Every `count`-th item starting at `index`: how shards split over ranks, then over workers."""
    return list(items[index::count])


def epoch_order(nshards: int, seed: int, epoch: int) -> list[int]:
    """Shard order for one epoch: a permutation identical on every rank, different every epoch."""
    order = list(range(nshards))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def repeated_order(order: Sequence[int], reps: int) -> list[int]:
    """Repeated augmentation (torchvision's RASampler, at the shard level): the first ceil(n / reps) shards of
    an epoch's order, each `reps` times in a row, cut to the order's length n. Dealt over ranks, the copies of a
    shard go to `reps` consecutive ranks (each augments its copy its own way) and the epoch stays n shards long;
    when `reps` does not divide n the last shard chosen has fewer copies. reps <= 1: the order unchanged."""
    if reps <= 1:
        return list(order)
    chosen = order[: -(-len(order) // reps)]
    return [shard for shard in chosen for _ in range(reps)][: len(order)]


def worker_shards(order: Sequence[int], rank: int, world: int, worker: int, workers: int) -> list[int]:
    """The shards one DataLoader worker of one rank reads in split mode (ranks first, then workers)."""
    return assigned(assigned(order, rank, world), worker, workers)


def batches_for(samples: int, batch_size: int) -> tuple[int, int]:
    """(full, partial) batches a worker makes of `samples`; a lone leftover sample joins the last full batch."""
    full, rest = divmod(samples, batch_size)
    return full, 1 if rest and not (rest == 1 and full) else 0


def loader_workers(nshards_for_rank: int, workers: int) -> int:
    """DataLoader workers worth starting: never more than the rank has shards (idle workers fail)."""
    return max(0, min(workers, nshards_for_rank))


def resampled_epoch_batches(total_samples: int, batch_size: int, world_size: int) -> int:
    """Batches per rank per epoch when shards are resampled: one pass over the data in total."""
    batches = total_samples // (batch_size * world_size)
    if batches < 1:
        raise ImagenetTrainError(
            f"epoch length: {total_samples} samples cannot fill one batch of {batch_size} on each of "
            f"{world_size} ranks; lower --batch-size or pass --epoch-batches"
        )
    return batches


class SetupLoaderSettings(Protocol):
    """What a Setup reads of a run's loader settings (config.LoaderConfig) or of the `plan` command's options."""

    workers: int
    batch_size: int
    mode: Mode
    epoch_batches: int
    repeat: int


@dataclass(frozen=True)
class Setup:
    """A launch configuration to check before any GPU is spent."""

    shard_sizes: tuple[int, ...]
    nodes: int = 1
    gpus_per_node: int = 1
    workers: int = WORKERS
    batch_size: int = BATCH_SIZE
    mode: Mode = Mode.RESAMPLED
    epoch_batches: int = (
        EPOCH_BATCHES  # resampled: 0 is one pass over the data; split: 0 is every shard once, else a cut
    )
    repeat: int = REPEAT  # split: each worker reads its shard list this many times per epoch
    join: bool = True  # split mode: the step runs under torch.distributed Join (imagenet-train always does)
    seed: int = SEED
    epoch: int = 0
    ra_reps: int = 1  # split/queue: repeated augmentation, each shard of a 1/ra_reps share read ra_reps times

    @property
    def world(self) -> int:
        """The number of ranks: nodes times GPUs per node."""
        return self.nodes * self.gpus_per_node

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", Mode(self.mode))
        except ValueError:
            raise ImagenetTrainError(f"plan: --mode must be resampled, split or queue, got '{self.mode}'") from None

    @classmethod
    def of(cls, loader: SetupLoaderSettings, seed: int, shard_sizes: Sequence[int], **given: Any) -> Setup:
        """The one way a run's Setup is made: workers, batch_size, mode, epoch_batches and repeat come from
        `loader` (the training config's loader section, or the `plan` command's options) unless `given`."""
        taken = {name: getattr(loader, name) for name in ("workers", "batch_size", "mode", "epoch_batches", "repeat")}
        taken["ra_reps"] = max(1, getattr(loader, "ra_reps", 1))  # the plan command has no --ra-reps
        return cls(tuple(shard_sizes), seed=seed, **(taken | given))


@dataclass(frozen=True)
class RankPlan:
    rank: int
    shards: tuple[int, ...]
    workers: int
    samples: int
    full_batches: int
    partial_batches: int
    batches: int
    worker_shards: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Assessment:
    setup: Setup
    ranks: tuple[RankPlan, ...]
    samples_per_epoch: int  # what the ranks consume together
    dropped: int  # samples of the data not seen this epoch
    duplicated: int  # samples seen more than once this epoch (resampled: expected draws beyond the data)
    level: Verdict
    reason: str  # why, for WARN and WILL HANG
    notes: tuple[str, ...]
    fix: str
    verdict: str = field(init=False)  # "OK", "WARN: reason", "WILL HANG: reason": what people and --json read

    def __post_init__(self) -> None:
        text = self.level.value if self.level is Verdict.OK else f"{self.level.value}: {self.reason}"
        object.__setattr__(self, "verdict", text)

    @property
    def hangs(self) -> bool:
        """Whether the launch would hang (verdict WILL HANG)."""
        return self.level is Verdict.HANG

    @property
    def fails(self) -> bool:
        """Whether `plan` exits 1: the launch would hang, or train other than as configured (REFUSED)."""
        return self.level in (Verdict.HANG, Verdict.REFUSE)


def rank_plans(setup: Setup) -> list[RankPlan]:
    """Each rank's shards, workers, samples and batches for one epoch of `setup` (no verdict)."""
    sizes = setup.shard_sizes
    ranks = []
    if setup.mode is Mode.RESAMPLED:
        batches = setup.epoch_batches or max(0, sum(sizes) // max(1, setup.batch_size * setup.world))
        for rank in range(setup.world):
            ranks.append(
                RankPlan(
                    rank, tuple(range(len(sizes))), setup.workers, batches * setup.batch_size, batches, 0, batches, ()
                )
            )
        return ranks
    order = repeated_order(epoch_order(len(sizes), setup.seed, setup.epoch), setup.ra_reps)
    if setup.mode is Mode.QUEUE:  # reads every shard once whatever --repeat and --epoch-batches say
        claims = equal_pace_claims(order, sizes, setup.world, setup.workers)
        return [
            _rank_plan(setup, rank, [s for w in mine for s in w], mine, setup.workers, 1, 0)
            for rank, mine in enumerate(claims)
        ]
    for rank in range(setup.world):
        mine = assigned(order, rank, setup.world)
        nworkers = loader_workers(len(mine), setup.workers)
        per_worker = [assigned(mine, w, max(nworkers, 1)) for w in range(max(nworkers, 1))]
        ranks.append(_rank_plan(setup, rank, mine, per_worker, nworkers, setup.repeat, setup.epoch_batches))
    return ranks


def _rank_plan(
    setup: Setup, rank: int, mine: list[int], per_worker: list[list[int]], workers: int, repeat: int, cut: int
) -> RankPlan:
    """One rank of split or queue mode: each worker batches its shards, read `repeat` times; `cut` (0: none)."""
    counts = [
        batches_for(sum(setup.shard_sizes[s] for s in shards) * repeat, setup.batch_size) for shards in per_worker
    ]
    full, partial = sum(c[0] for c in counts), sum(c[1] for c in counts)
    runs = min(cut, full + partial) if cut else full + partial
    samples = sum(setup.shard_sizes[s] for s in mine) * repeat
    return RankPlan(rank, tuple(mine), workers, samples, full, partial, runs, tuple(map(tuple, per_worker)))


def assess(setup: Setup) -> Assessment:
    """Per-rank shards and batches for one epoch, what is dropped or repeated, and whether DDP will hang."""
    if setup.world < 1 or setup.batch_size < 1 or setup.workers < 0:
        raise ImagenetTrainError("plan: nodes, gpus per node and batch size must be at least 1")
    if not setup.shard_sizes:
        raise ImagenetTrainError("plan: no shards")
    ranks = rank_plans(setup)
    if setup.mode is Mode.RESAMPLED:
        return _assess_resampled(setup, ranks)
    if refused := _batch_beyond_data(setup, ranks):
        return refused
    if setup.mode is Mode.QUEUE:
        return _assess_queue(setup, ranks)
    notes = _idle_worker_notes(setup, ranks)
    if setup.epoch_batches:
        return _assess_cut_split(setup, ranks, sum(setup.shard_sizes), notes)
    return _assess_split(setup, ranks, notes)


class RunChoices(Protocol):
    """What the verdict reads of a run's settings (config.RunConfig)."""

    seed: int
    force: bool


class PlannedSettings(Protocol):
    """A run's settings as the verdict reads them (config.Config): planning/ never imports config. Read-only
    members, so that config's sections, which hold more than these, satisfy them."""

    @property
    def loader(self) -> SetupLoaderSettings:
        """The loader section."""
        ...

    @property
    def run(self) -> RunChoices:
        """The run section."""
        ...


def preflight_check(
    cfg: PlannedSettings, train_sizes: Sequence[int] | None, world: int, warn: bool = False
) -> Assessment | None:
    """The planner's verdict on `world` ranks training `cfg`; raises if they would hang (unless --force), and
    with `warn` logs any other verdict but OK (every rank reaches the same verdict from the same inputs)."""
    if train_sizes is None:
        return None
    assessment = assess(Setup.of(cfg.loader, cfg.run.seed, train_sizes, gpus_per_node=world))
    if assessment.level is Verdict.REFUSE:  # not a hang: --force cannot make this batch fit the data
        raise ImagenetTrainError(f"pre-flight: {assessment.verdict}; {assessment.fix}")
    if assessment.hangs and not cfg.run.force:
        raise ImagenetTrainError(f"pre-flight: {assessment.verdict}; {assessment.fix} (--force runs anyway)")
    if warn and assessment.level is not Verdict.OK:
        log.warning("pre-flight: %s; suggested fix: %s", assessment.verdict, assessment.fix)
    return assessment


def _assess_resampled(setup: Setup, ranks: list[RankPlan]) -> Assessment:
    """Resampled mode: equal batches on every rank; does an epoch fill a batch, and does it draw repeats?"""
    total, batches = sum(setup.shard_sizes), ranks[0].batches
    consumed = batches * setup.batch_size * setup.world
    dropped, duplicated = max(0, total - consumed), max(0, consumed - total)
    notes: tuple[str, ...] = ()
    (level, reason), fix = (Verdict.OK, ""), ""
    if batches == 0:
        level = Verdict.HANG
        reason = f"{total} samples cannot fill one batch of {setup.batch_size} on {setup.world} ranks"
        fix = "lower --batch-size or set --epoch-batches"
    elif empty := sum(1 for size in setup.shard_sizes if size == 0):
        # Draws with replacement meet empty shards in runs of random length; the loader stops a stream after
        # 2 x shards + 8 of them in a row (it cannot tell an index of empty shards from a dead source).
        level = Verdict.WARN
        reason = f"{empty} of {len(setup.shard_sizes)} shards are empty: resampled draws may stop on a run of them"
        fix = "drop the empty shards from the index (`imagenet-train shards` writes none) or use --mode split"
    elif consumed > total:
        level = Verdict.WARN
        reason = f"an epoch draws {consumed} samples from {total}: {consumed - total} repeats per epoch"
        fix = f"--epoch-batches {total // (setup.batch_size * setup.world)} for one pass over the data"
    else:
        notes = (
            "resampled: shards are drawn with replacement, so some samples repeat and others wait "
            "for a later epoch; every rank gets exactly the same number of batches",
        )
    return Assessment(setup, tuple(ranks), consumed, dropped, duplicated, level, reason, notes, fix)


def _batch_beyond_data(setup: Setup, ranks: list[RankPlan]) -> Assessment | None:
    """Split and queue modes: a global batch larger than an epoch's samples makes every step a partial batch while
    the LR is scaled for the full one (loss up, top-1 at chance): refused, with the largest batch that fits."""
    samples, global_batch = sum(r.samples for r in ranks), setup.batch_size * setup.world
    if samples >= global_batch:
        return None
    reason = (
        f"--batch-size {setup.batch_size} on {setup.world} rank{'s' * (setup.world != 1)} is a global batch of "
        f"{global_batch}, more than "
        f"the {samples} samples of an epoch: every step would be a partial batch, with the LR scaled for "
        f"{global_batch}"
    )
    fix = f"--batch-size {samples // setup.world} or lower" if samples >= setup.world else "more samples than ranks"
    return Assessment(setup, tuple(ranks), samples, 0, 0, Verdict.REFUSE, reason, (), fix)


def _assess_queue(setup: Setup, ranks: list[RankPlan]) -> Assessment:
    """Queue mode: batches follow each rank's speed; is there a Join, and a shard for every worker?"""
    notes = (
        "queue: shards are handed out at run time, so a rank's batches follow its speed; the "
        "counts above are what each rank gets when all workers read at the same pace; every sample is read once",
    )
    (level, reason), fix = (Verdict.OK, ""), ""
    workers = setup.world * max(setup.workers, 1)
    if not setup.join and setup.world > 1:
        level, reason = Verdict.HANG, "queue mode gives ranks different batch counts and the step has no Join"
        fix = "run the step under Join (imagenet-train does) or use --mode resampled"
    elif len(setup.shard_sizes) < workers:
        level = Verdict.WARN
        reason = f"{len(setup.shard_sizes)} shards for {workers} workers: some workers never get a shard"
        fix = "more, smaller shards (lower --maxcount)"
    total = sum(setup.shard_sizes)
    return Assessment(setup, tuple(ranks), total, 0, 0, level, reason, notes, fix)


def _idle_worker_notes(setup: Setup, ranks: list[RankPlan]) -> list[str]:
    """Split mode: a note when some ranks have fewer shards than --workers (the loader starts fewer)."""
    idle_workers = [(r.rank, setup.workers - r.workers) for r in ranks if r.shards and r.workers < setup.workers]
    if not idle_workers:
        return []
    rank, idle = idle_workers[0]
    return [
        f"{len(idle_workers)} ranks have fewer shards than --workers (rank {rank}: {idle} idle); "
        "the loader starts only as many workers as shards"
    ]


def _assess_split(setup: Setup, ranks: list[RankPlan], notes: list[str]) -> Assessment:
    """Split mode, every shard once: do the ranks get different batch counts, and is there a Join?"""
    counts = [r.batches for r in ranks]
    idle_ranks = [r.rank for r in ranks if not r.shards]
    (level, reason), fix = (Verdict.OK, ""), ""
    if len(set(counts)) > 1 and not setup.join:
        level = Verdict.HANG
        reason = (
            f"ranks get {min(counts)}..{max(counts)} batches and the step has no Join; "
            "DDP waits forever on the ranks that finished first"
        )
        fix = (
            f"run the step under Join (imagenet-train does), or --mode resampled, or stop every rank at "
            f"{min(counts)} batches (drops {sum(counts) - min(counts) * len(counts)} batches)"
        )
    elif idle_ranks:
        level = Verdict.WARN
        reason = (
            f"{len(idle_ranks)} of {setup.world} ranks get no shard (first: rank {idle_ranks[0]}) and idle all epoch"
        )
        fix = f"make at least {setup.world} shards (smaller --maxcount) or use --mode resampled"
    elif len(set(counts)) > 1:
        waste = sum(max(counts) - c for c in counts)
        level = Verdict.WARN
        reason = (
            f"ranks get {min(counts)}..{max(counts)} batches; Join shadows {waste} steps of the ranks that finish first"
        )
        fix = "shards that divide evenly over ranks x workers, or --mode resampled"
    total = sum(setup.shard_sizes)
    return Assessment(setup, tuple(ranks), total, 0, 0, level, reason, tuple(notes), fix)


def _assess_cut_split(setup: Setup, ranks: list[RankPlan], total: int, notes: list[str]) -> Assessment:
    """Split mode cut at --epoch-batches (the classic fixed-length epoch): does every rank get there?"""
    target = setup.epoch_batches
    available = [r.full_batches + r.partial_batches for r in ranks]
    consumed = sum(min(target * setup.batch_size, r.samples) for r in ranks)
    dropped, duplicated = max(0, total - consumed), max(0, consumed - total)
    short = [r.rank for r, a in zip(ranks, available, strict=True) if a < target]
    if not short:
        return Assessment(setup, tuple(ranks), consumed, dropped, duplicated, Verdict.OK, "", tuple(notes), "")
    per_repeat = min(available) / setup.repeat
    repeat = math.ceil(target / per_repeat) if per_repeat else 0
    fixes = [f"--epoch-batches {min(available)}"] + ([f"--repeat {repeat}"] if repeat else [])
    reason = f"{len(short)} ranks run out before --epoch-batches {target} (rank {short[0]} has {available[short[0]]})"
    level, reason = (
        (Verdict.HANG, f"{reason} and the step has no Join")
        if not setup.join
        else (Verdict.WARN, f"{reason}; Join evens them out")
    )
    fix = " or ".join(fixes)
    return Assessment(setup, tuple(ranks), consumed, dropped, duplicated, level, reason, tuple(notes), fix)
