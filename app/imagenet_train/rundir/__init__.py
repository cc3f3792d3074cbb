"""The run directory's files: the directory as the loop uses it (RunDirectory) with the position key logs,
checkpoints, config.json and metrics.jsonl, TensorBoard events, MLflow and W&B, and their mirror in a bucket. Built by
main/ and handed to training/ (training/parts.py types it), and used by the commands; imports nothing of training/
or loading/."""
