"""Preloaded by the loaders' forkserver (workers.FORKSERVER_PRELOAD): the forkserver dies with its rank.

Its import is its one job, so that no other module does anything when imported. The forkserver's
DataLoader workers die with the forkserver in turn (workers.worker_init), so a rank killed outright
leaves no loader process behind. Imported anywhere but in a forkserver (a script, a test that imports
every module), it does nothing: the check below reads how this process was started.
"""

import sys

from imagenet_train.loading.workers import forkserver_dies_with_rank

if "multiprocessing.forkserver" in " ".join(getattr(sys, "orig_argv", [])):
    forkserver_dies_with_rank()
