"""The planner's verdict as the table `imagenet-train plan` prints: one row per rank, the epoch's totals, the
verdict and a suggested fix. No torch, no I/O."""

from __future__ import annotations

from imagenet_train.planning.plan import Assessment


def format_assessment(assessment: Assessment, show_workers: bool = False) -> str:
    """The human table: one row per rank, then the epoch totals, the verdict and a suggested fix."""
    setup = assessment.setup
    lines = [
        f"plan: {len(setup.shard_sizes)} shards, {sum(setup.shard_sizes)} samples; {setup.nodes} nodes x "
        f"{setup.gpus_per_node} GPUs = {setup.world} ranks; {setup.workers} workers/rank; batch {setup.batch_size}; "
        f"mode {setup.mode}",
        f"{'rank':>5} {'shards':>7} {'workers':>8} {'samples':>9} {'full':>6} {'partial':>8} {'batches':>8}",
    ]
    for r in assessment.ranks:
        lines.append(
            f"{r.rank:>5} {len(r.shards):>7} {r.workers:>8} {r.samples:>9} {r.full_batches:>6} "
            f"{r.partial_batches:>8} {r.batches:>8}"
        )
        if show_workers:
            for worker, shards in enumerate(r.worker_shards):
                lines.append(f"{'':>5}   worker {worker}: shards {', '.join(map(str, shards)) or '-'}")
    lines.append(
        f"per epoch: {assessment.samples_per_epoch} samples consumed, {assessment.dropped} not seen, "
        f"{assessment.duplicated} repeated"
    )
    lines += [f"note: {note}" for note in assessment.notes]
    lines.append(f"verdict: {assessment.verdict}")
    if assessment.fix:
        lines.append(f"suggested fix: {assessment.fix}")
    return "\n".join(lines)
