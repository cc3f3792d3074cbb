"""The DDP loop and what it needs: the training step (model, optimizer, loss, mixing, EMA), evaluation, the
per-step hooks with the pre-emption vote, progress, distributed set-up."""
