"""Imported first by the loaders' forkserver: from then on it and every DataLoader worker forked from it
leave pre-emption signals to their rank (Slurm signals every process of a job step; the rank checkpoints
and stops, and its loader processes die with it)."""

import signal

for _number in (signal.SIGUSR1, signal.SIGINT):
    signal.signal(_number, signal.SIG_IGN)
