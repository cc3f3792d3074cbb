"""Moved: the stages to loading/stages.py, worker processes to loading/workers.py, the epoch stream to
loading/stream.py, shard URL resolution to datasets/source.py. Re-exported here until importers move."""

from imagenet_train.datasets.source import DataSource, ShardInfo, expand_urls, expected_shards, resolve_source
from imagenet_train.loading.stages import (
    Batch,
    BrokenShard,
    DamageCounters,
    ShardReading,
    batched,
    collate,
    decoded,
    interleaved,
    read_shards,
    samples_in_tar,
    shuffled,
)
from imagenet_train.loading.stream import EpochLoader, ShardStream
from imagenet_train.loading.workers import (
    die_with_parent,
    main_script_hidden,
    start_resource_tracker,
    worker_context,
)

__all__ = [
    "Batch",
    "BrokenShard",
    "DamageCounters",
    "DataSource",
    "EpochLoader",
    "ShardInfo",
    "ShardReading",
    "ShardStream",
    "batched",
    "collate",
    "decoded",
    "die_with_parent",
    "expand_urls",
    "expected_shards",
    "interleaved",
    "main_script_hidden",
    "read_shards",
    "resolve_source",
    "samples_in_tar",
    "shuffled",
    "start_resource_tracker",
    "worker_context",
]
