"""DataLoader worker processes: where they come from (a forkserver), how they start, die and are stopped."""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType

# What the forkserver imports once, before it forks any worker. The first two only set up the forkserver
# itself (signal dispositions, death with its rank); the epoch stream pulls in torch and the stages, the decoders
# and augmentation (presets: torchvision, simplejpeg, PIL) and the worker's log redaction are what unpickling a
# ShardStream and worker_init import. Left to each worker, those imports were more than half of a cold epoch's
# first batch (bench/first_batch.py, 2 workers on 2 cores); preloaded, a worker starts with them imported.
FORKSERVER_PRELOAD = [
    "imagenet_train.loading.loader_signals",
    "imagenet_train.loading.forkserver_dies_with_rank",
    "imagenet_train.loading.stream",
    "imagenet_train.loading.presets",
    "imagenet_train.loading.fused_decoder",
    "imagenet_train.loading.dali",
    "imagenet_train.redact",
]


def worker_context() -> multiprocessing.context.BaseContext:
    """Where DataLoader workers come from: a clean forkserver, never a fork of the training process.

    Forking a rank that already runs gloo/NCCL and tqdm threads can deadlock the child inside fork
    (seen here: a val worker stuck before it started, its rank waiting forever, the peer rank
    blocked in all_reduce). The forkserver preloads the loader's modules, so workers still start fast.
    """
    context = multiprocessing.get_context("forkserver")
    if not _preloaded:
        start_resource_tracker()
        context.set_forkserver_preload(FORKSERVER_PRELOAD)
        # Registered after multiprocessing's own exit handler (imported above), so it runs first: that handler
        # sends SIGTERM to every daemon child and joins it, which would wait forever on a loader worker.
        atexit.register(kill_started_workers)
        _preloaded.append(True)
    return context


_preloaded: list = []
_started: weakref.WeakSet = weakref.WeakSet()  # every DataLoader worker process this process started


def start_worker_server() -> None:
    """Start the workers' forkserver now, so its imports (torch, torchvision: about a second) overlap whatever this
    process does next, such as building the model, instead of delaying the first batch.

    The forkserver is a fresh interpreter (fork and exec), so starting it early forks nothing that holds threads.
    """
    from multiprocessing import forkserver

    worker_context()
    with main_script_hidden():  # the forkserver would import the main script with its preloads
        forkserver.ensure_running()


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker deaf to SIGUSR1, as it already is to SIGINT and SIGTERM.

    Slurm sends its pre-emption signal to every process of a job step: a tracker killed by it is relaunched
    while the rank shuts its loaders down, prints a KeyError traceback per semaphore and can no longer clean
    up. A signal blocked while the tracker starts stays blocked in it (the mask survives fork and exec).
    """
    from multiprocessing import resource_tracker

    if not hasattr(signal, "pthread_sigmask"):
        resource_tracker.ensure_running()
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def main_script_hidden() -> Iterator[None]:
    """Start worker processes without the `__main__` script, so loaders work from any script or notebook.

    multiprocessing has each forkserver child run the main script again (as `__mp_main__`): a script that
    builds a loader at top level, without an `if __name__ == "__main__":` guard, would start over in every
    worker and the workers would die. Worker code lives in this package and never needs `__main__`.
    """
    main = sys.modules["__main__"]
    script = main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        if script is not None:
            main.__file__ = script


def die_with_parent(parent: int | None = None) -> None:
    """Linux: have the kernel SIGKILL this process when its parent (pid `parent`, when known) dies.

    A rank killed outright (OOM killer, SIGKILL) cannot shut its loader down; without this its
    forkserver and DataLoader workers live on, each holding hundreds of MB. The forkserver dies with
    its rank, the workers with their forkserver (PyTorch's own watchdog only sees the forkserver).
    """
    if sys.platform.startswith("linux"):
        import ctypes

        # Compared with the parent's pid, not with pid 1: in a container without an init the rank itself is
        # pid 1 (`--entrypoint imagenet-train`), and an orphan goes to the nearest subreaper anyway.
        expected = os.getppid() if parent is None else parent
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != expected:  # the parent died before the request took effect
            os._exit(1)


_forkserver: list[int] = []  # in the forkserver, and in every worker forked from it: the forkserver's pid


def forkserver_dies_with_rank() -> None:
    """In the forkserver, as it starts: die with the rank, and note this pid for the workers forked from here.

    A rank gone before this is read as the parent: the forkserver then leaves by itself, at the end of the
    pipe the rank holds open (multiprocessing's forkserver loop).
    """
    _forkserver.append(os.getpid())
    die_with_parent()


def worker_init(_: int) -> None:
    """Run first in every DataLoader worker: die with the forkserver, leave pre-emption signals to the rank, say
    nothing of a batch's hand-over that the rank left, and redact the secrets of URLs its warnings name."""
    die_with_parent(_forkserver[0] if _forkserver else None)  # a forkserver gone since the fork: leave now
    from imagenet_train.loading.loader_signals import leave_to_the_rank
    from imagenet_train.redact import redact_logs

    redact_logs()

    # Called, not left to the import: a forkserver child has the module imported already, and torch's worker
    # loop has just installed its own SIGTERM handler, which dies of a signal its parent did not send.
    leave_to_the_rank()
    sys.excepthook = quiet_abandoned_handovers(sys.excepthook)


# A batch's tensors reach the rank as file descriptors: the worker's multiprocessing resource sharer serves each
# one on a thread, and hands any error there to sys.excepthook, which prints a traceback. A rank that leaves on
# a stop signal mid-hand-over (its workers still alive for a moment) makes that thread's accept or send fail.
HANDOVER_ERRORS = (EOFError, OSError, multiprocessing.AuthenticationError)


def quiet_abandoned_handovers(hook: Callable) -> Callable:
    """`hook` (sys.excepthook), except for a connection error in the resource sharer's serving thread: the rank
    on the other end left, and says why itself (a hand-over it still waits for fails on its side, in one line)."""

    def excepthook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        first = traceback.extract_tb(trace, limit=1)
        served = bool(first) and first[0].name == "_serve" and first[0].filename.endswith("resource_sharer.py")
        if not (served and isinstance(error, HANDOVER_ERRORS)):
            hook(kind, error, trace)

    return excepthook


def track_workers(batches) -> None:
    """Note a DataLoader iterator's worker processes, for `kill_started_workers` at exit."""
    _started.update(getattr(batches, "_workers", []))


def stop_workers(batches) -> None:
    """Stop a DataLoader iterator's workers, killing those that outlive torch's own shutdown."""
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown:
        shutdown()
    _kill(getattr(batches, "_workers", []))


def kill_started_workers() -> None:
    """Kill the loader workers still alive as this process exits.

    A worker ignores SIGTERM (loader_signals), so the terminate() of torch's shutdown does not end one that
    is stuck, say reading from a stalled shard server, and a run that fails there would otherwise hang in
    multiprocessing's exit handler, which joins every child it terminated.
    """
    _kill(list(_started))


def _kill(workers: Iterable[multiprocessing.process.BaseProcess]) -> None:
    for worker in workers:
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=5)
