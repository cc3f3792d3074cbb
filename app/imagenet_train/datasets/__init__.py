"""From a dataset on disk to shards: dataset layouts, image checks, the shard writer, the wids
index and a run's data source, the digits and Fashion-MNIST demo data."""
