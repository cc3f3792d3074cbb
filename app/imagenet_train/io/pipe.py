"""`pipe:` shards, as WebDataset names them: a shell command's standard output read as the shard's bytes.

The command's exit status is read when its output has been read to the end, so a command that fails (a
`curl` that lost its server, a missing file) breaks the shard as truncated bytes would, instead of passing for
a short shard; one that fails after the tar's end-of-archive marker (which the tar reader stops at) is named in
a warning when the stream closes. A stream closed before the command's end (a resampled epoch that ends inside
the shard) ends the command: a command still writing dies of SIGPIPE and its shell reaps it; one that writes
nothing more is killed with its whole process group after CLOSE_WAIT_S. A reader that dies without closing
(a loader worker killed outright) takes the command's process group with it (see WATCHED).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, cast

from imagenet_train.errors import ImagenetTrainError, clip

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

log = logging.getLogger(__name__)

EXIT_WAIT_S = 30.0  # how long a command may run on once its output has ended
CLOSE_WAIT_S = 5.0  # how long a command closed early has to end by itself (SIGPIPE) before it is killed

# The command ($1) runs under a shell of its own inside a process group of its own, beside a watcher. The
# watcher reads a pipe whose only writer is the reader's process; at its end (the reader died, even by SIGKILL,
# without closing the stream) it kills the group: the command, its children and itself. Without it a command
# that writes nothing more (a stalled download) outlives a killed reader, as only a write meets the SIGPIPE.
# The outer shell gives the command its output and keeps none (so the output ends when the command's does),
# reaps it and the watcher (no zombie for a rank that is pid 1), and exits with the command's status; its own
# stderr goes too (bash reports the watcher it killed there). As an asynchronous list, the command starts with
# SIGINT and SIGQUIT ignored (POSIX), which only a signal sent to the command itself would notice. What the
# command moves out of the group (setsid), or leaves running after its own shell has exited, is not watched.
# Not PR_SET_PDEATHSIG: that reaches the shell alone, through a signal a loader worker ignores (which the shell
# then cannot trap), and fires when the thread that started the command ends.
WATCHED = """exec 9<&0 </dev/null
{ read -r _ <&9; kill -KILL 0; } >/dev/null 2>&1 &
watcher=$!
exec 9<&-
/bin/sh -c "$1" &
command=$!
exec >/dev/null 2>&1
wait $command
status=$?
kill -KILL $watcher
wait $watcher
exit $status"""


# The command's own process group, so ending it ends every process of it. Popen's process_group is Python 3.11's;
# on 3.10 the child calls setpgid(0, 0) itself (os.setpgrp, async-signal-safe, so safe in a threaded parent).
OWN_PROCESS_GROUP: dict = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


class CommandFailed(ImagenetTrainError):
    """A `pipe:` command whose output ended failed, or did not exit; `reason` says which, without the URL.

    One message argument, as torch rebuilds an exception raised in a DataLoader worker."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


def exit_reason(status: int) -> str:
    """A command's exit status in words ("" for success); a shell reports a signal as 128 + its number."""
    if status < 0 or status > 128:
        number = -status if status < 0 else status - 128
        try:
            return f"was killed by {signal.Signals(number).name}"
        except ValueError:
            return f"exited with status {status}"
    return f"exited with status {status}" if status else ""


class CommandStream(io.RawIOBase):
    """The output of `location`'s command (`pipe:COMMAND`), run by the shell in a process group of its own so
    that ending it ends every process of it."""

    def __init__(self, location: str):
        self.location = location
        command = location.removeprefix("pipe:")
        watched, self.lifeline = os.pipe()  # this process's death closes the lifeline: see WATCHED
        try:
            self.process = subprocess.Popen(
                ["/bin/sh", "-c", WATCHED, "sh", command],
                stdin=watched,
                stdout=subprocess.PIPE,
                bufsize=0,
                **OWN_PROCESS_GROUP,
            )
        except BaseException:
            os.close(self.lifeline)
            raise
        finally:
            os.close(watched)
        self.output = cast(io.RawIOBase, self.process.stdout)  # stdout=PIPE with bufsize=0: a raw FileIO
        self.exit_read = False  # the exit status was read at the output's end (and raised if it was a failure)

    def readable(self) -> bool:
        """Always: the command's output is read, never written."""
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        """Fill `buffer` from the command's output; at its end, raise CommandFailed unless the command succeeded."""
        count = self.output.readinto(buffer) or 0  # None: no data yet, only from a non-blocking pipe
        if not count:
            self._check_exit()
        return count

    def _failed(self, reason: str) -> CommandFailed:
        return CommandFailed(f"{clip(self.location)}: {reason}", reason)

    def _check_exit(self) -> None:
        self.exit_read = True
        try:
            status = self.process.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self._kill()
            raise self._failed(f"the command still ran {EXIT_WAIT_S:.0f} s after its output ended") from None
        if status:
            raise self._failed(f"the command {exit_reason(status)}")

    def _kill(self) -> None:
        """Kill the command's process group and reap the shell. KILL, not TERM: the loader's workers block and
        ignore the stop signals (loading/loader_signals.py), and a command inherits both. The rest of the group
        goes to the nearest reaper: where that is this reader (a rank that is pid 1), it is reaped here."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        with contextlib.suppress(ChildProcessError):
            while True:
                os.waitpid(-self.process.pid, 0)

    def close(self) -> None:
        """Close the output and see the command end: a failure nobody read to is a warning; a command that
        outlives CLOSE_WAIT_S is killed."""
        if self.closed:
            return
        ended = self.process.poll()  # before closing: an exit caused by the close (SIGPIPE) is no failure
        self.output.close()
        if ended and not self.exit_read:
            log.warning("%s: the command %s past what was read of it", clip(self.location), exit_reason(ended))
        elif ended is None:
            try:
                self.process.wait(CLOSE_WAIT_S)
            except subprocess.TimeoutExpired:
                self._kill()
        os.close(self.lifeline)  # the watcher has ended with the command (or was killed with its group)
        super().close()
