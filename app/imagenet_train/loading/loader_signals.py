"""Imported first by the loaders' forkserver: from then on it and every DataLoader worker forked from it
leave pre-emption signals to their rank: torchrun signals each rank's whole process group and Slurm every
process of a job step, but only the rank can finish its step and checkpoint. Loader processes die with
their rank (PR_SET_PDEATHSIG), and the loader kills any that outlive its shutdown."""

import signal

for _number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
    signal.signal(_number, signal.SIG_IGN)
