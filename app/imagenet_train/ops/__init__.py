"""Operations around training: the nginx shard server and the readiness probe."""
