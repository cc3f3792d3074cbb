"""The DDP loop and what it needs: checkpoints, distributed set-up, pre-emption, the results
mirror, metrics and TensorBoard events, reports."""
