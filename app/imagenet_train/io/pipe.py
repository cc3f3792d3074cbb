"""`pipe:` shards, as WebDataset names them: a shell command's standard output read as the shard's bytes.

The command's exit status is read when its output ends, so a command that fails (a `curl` that lost its
server, a missing file) breaks the shard as truncated bytes would, instead of passing for a short shard. A
stream closed before its end (a resampled epoch that ends inside the shard) ends the command and says nothing.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess

from imagenet_train.errors import ImagenetTrainError, clip

EXIT_WAIT_S = 30.0  # how long a command may run on once its output has ended


class CommandFailed(ImagenetTrainError):
    """A `pipe:` command whose output ended failed, or did not exit; `reason` says which, without the URL."""

    def __init__(self, location: str, reason: str):
        super().__init__(f"{clip(location)}: {reason}")
        self.reason = reason


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
    """The output of `location`'s command (`pipe:COMMAND`, run by the shell in a process group of its own, so
    that closing the stream early ends every process of it)."""

    def __init__(self, location: str):
        self.location = location
        command = location.removeprefix("pipe:")
        self.process = subprocess.Popen(command, shell=True, stdout=subprocess.PIPE, bufsize=0, process_group=0)

    def readable(self) -> bool:
        """Always: the command's output is read, never written."""
        return True

    def readinto(self, buffer) -> int:
        """Fill `buffer` from the command's output; at its end, raise CommandFailed unless the command succeeded."""
        count = self.process.stdout.readinto(buffer)
        if not count:
            self._check_exit()
        return count

    def _check_exit(self) -> None:
        try:
            status = self.process.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self._end()
            reason = f"the command still ran {EXIT_WAIT_S:.0f} s after its output ended"
            raise CommandFailed(self.location, reason) from None
        if status:
            raise CommandFailed(self.location, f"the command {exit_reason(status)}")

    def _end(self) -> None:
        """Kill the command's process group and reap the shell. KILL, not TERM: the loader's workers block and
        ignore the stop signals (loading/loader_signals.py), and a command inherits both."""
        with contextlib.suppress(ProcessLookupError):  # gone already, the shell and all it started
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def close(self) -> None:
        """Close the output, and end the command if it still runs."""
        if not self.closed:
            self.process.stdout.close()
            if self.process.poll() is None:  # closed before the output's end: nobody reads the rest
                self._end()
        super().close()
