"""The DDP loop and what it needs: the step, evaluation, the per-step hooks, distributed set-up,
pre-emption, trackers."""
