"""The run directory's files: checkpoints, config.json and metrics.jsonl, TensorBoard events, the position key
logs, and their mirror in a bucket. Used by training/ and the commands; imports nothing of training/."""
