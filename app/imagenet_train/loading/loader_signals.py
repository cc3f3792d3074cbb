"""Imported first by the loaders' forkserver: from then on it and every DataLoader worker forked from it
leave pre-emption signals to their rank: torchrun signals each rank's whole process group and Slurm every
process of a job step, but only the rank can finish its step and checkpoint. Loader processes die with
their rank (PR_SET_PDEATHSIG), and the loader kills any that outlive its shutdown."""

import signal

LEFT_TO_THE_RANK = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def leave_to_the_rank() -> None:
    """Ignore the pre-emption signals in this loader process (and take any that came meanwhile as ignored)."""
    for number in LEFT_TO_THE_RANK:
        signal.signal(number, signal.SIG_IGN)  # discards one that is pending
    signal.pthread_sigmask(signal.SIG_UNBLOCK, LEFT_TO_THE_RANK)


leave_to_the_rank()
# The forkserver's children are born with these signals blocked: torch's worker loop installs a SIGTERM handler
# of its own before the worker's init ignores the signal again, and one sent in between then waits instead.
signal.pthread_sigmask(signal.SIG_BLOCK, LEFT_TO_THE_RANK)
