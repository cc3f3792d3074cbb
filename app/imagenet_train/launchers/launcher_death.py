"""A rank dies with its launcher: when torchrun's agent (or `imagenet-train launch`) is gone, even SIGKILLed,
the rank stops as if the agent had sent it SIGTERM, and is killed with its loader processes after the grace
period the agent would have given it.

torchrun starts each rank in a session of its own, so a killed agent takes no rank with it: without this the
ranks live on as orphans (parent PID 1), holding their ports, memory and GPU. The watch is a thread waiting on
a pidfd of the parent process rather than PR_SET_PDEATHSIG, because that signal fires when the parent *thread*
that started the rank exits: an agent that started its workers from a thread it later ends would pre-empt a
healthy run. The loader's forkserver and workers already die with their rank (loading/workers.die_with_parent).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Mapping

# torchrun's own default for --shutdown-timeout: the seconds between its SIGTERM to the ranks and its SIGKILL.
TORCHRUN_SHUTDOWN_TIMEOUT = 30.0
# Where a rank reads the launcher's grace period, in torchrun's order (its flag's variable, then its fallback);
# `launch` sets both to its --grace-period.
GRACE_VARIABLES = ("PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
POLL_SECONDS = 0.5  # without pidfds (Linux < 5.3): how often the parent is looked at
_watching: list[threading.Thread] = []  # one watch per process, however often the CLI's main is called


def launcher_grace(env: Mapping[str, str]) -> float:
    """Seconds a rank whose launcher died gets to stop before it is killed: the launcher's own grace period."""
    for name in GRACE_VARIABLES:
        value = env.get(name, "").strip()
        with contextlib.suppress(ValueError):
            if float(value) >= 0:
                return float(value)
    return TORCHRUN_SHUTDOWN_TIMEOUT


def started_by_torchrun(env: Mapping[str, str]) -> bool:
    """Whether this process is a rank torchrun's agent started (its parent is the launcher)."""
    return "TORCHELASTIC_RUN_ID" in env


def die_with_launcher(env: Mapping[str, str] | None = None) -> threading.Thread | None:
    """In a torchrun rank: watch the parent; when it dies, SIGTERM this rank, then SIGKILL it after the grace."""
    env = os.environ if env is None else env
    if not started_by_torchrun(env) or not sys.platform.startswith("linux"):
        return None
    if not _watching:
        parent, grace = os.getppid(), launcher_grace(env)
        _watching.append(threading.Thread(target=_watch, args=(parent, grace), name="launcher-watch", daemon=True))
        _watching[0].start()
    return _watching[0]


def _wait_for_exit(parent: int) -> None:
    """Return once process `parent` has exited (at once if it already has: this process was re-parented)."""
    try:
        handle = os.pidfd_open(parent)
    except (AttributeError, OSError):  # no pidfd here, or the parent is already gone
        handle = None
    if handle is not None:
        try:
            if os.getppid() == parent:  # the pidfd is the parent's, not a later process that took its id
                waiter = select.poll()  # readable once the process has exited
                waiter.register(handle, select.POLLIN)
                waiter.poll()
        finally:
            os.close(handle)
        return
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)


def _watch(parent: int, grace: float) -> None:
    _wait_for_exit(parent)
    rank = os.environ.get("RANK", "?")
    print(
        f"imagenet-train: rank {rank}: its launcher (pid {parent}) is gone; stopping as on SIGTERM, "
        f"killed in {grace:g} s if still running",
        file=sys.stderr,
        flush=True,
    )
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace)
    print(f"imagenet-train: rank {rank}: still running {grace:g} s after its launcher died; killed", file=sys.stderr)
    sys.stderr.flush()
    # torchrun made the rank a session (and group) leader: its loader forkserver and workers go with it.
    if os.getpgid(0) == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
