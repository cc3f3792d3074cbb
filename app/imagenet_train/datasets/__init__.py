"""From a dataset on disk to shards: dataset layouts, image checks, the shard writer, the wids
index, the digits demo data."""
