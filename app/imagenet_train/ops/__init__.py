"""Operations around training: the nginx shard server, the readiness probe, and `report` on a finished run."""
