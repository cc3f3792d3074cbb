"""User-facing errors: one line naming the input and what was expected."""

import reprlib

CLIP = 80  # characters of an input value an error line echoes at most


# repr() of a nested value builds the whole text first: a YAML alias bomb or a hostile index can make that
# hundreds of megabytes. reprlib stops after a few items per level.
class _Short(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        return repr(x) if x.bit_length() < 256 else f"<a {x.bit_length()}-bit integer>"


_REPR = _Short()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, CLIP, CLIP
_REPR.maxdict = _REPR.maxlist = _REPR.maxtuple = _REPR.maxset = 4


class ImagenetTrainError(Exception):
    """An error caused by the user's input or environment, printed without a traceback."""


def visible(text: str) -> str:
    """`text` with every character a terminal or a log reader would act on made visible as its escape.

    Untrusted text (a server's reason phrase or body, a tar member name or key, a file name from a source tree,
    a tracker's answer) passes through here on its way to a terminal or a log: C0 and C1 controls, ESC, DEL, line
    and paragraph separators and bidi overrides become `\\x1b`, `\\r`, `\\u202e`, so an OSC or CSI sequence
    cannot retitle or clear the terminal, a carriage return cannot hide the URL before it, and a newline cannot
    forge a log line. Printable text is returned as it is.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def clip(value: object, limit: int = CLIP) -> str:
    """`value` as printable text of at most `limit` characters (cut with '...'), for echoing input in an error."""
    text = value[: limit + 1] if isinstance(value, str) else _REPR.repr(value)
    text = visible(text[: limit + 1])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(message: str) -> str:
    """Reduce an error message (possibly re-raised from a DataLoader worker) to its last line."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    last = lines[-1]
    # A worker exception re-raised by DataLoader ends with "ImagenetTrainError: <message>".
    prefix = f"{ImagenetTrainError.__name__}: "
    return last.split(prefix, 1)[1] if prefix in last else last


class Preempted(Exception):
    """The run stopped cleanly on a signal (SIGTERM, SIGUSR1) after saving its position."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """128 + N, as for a process killed by signal N: schedulers read it as 'pre-empted, retry'."""
        return 128 + self.signum


class PreflightFailed(Exception):
    """Ranks failed a preflight check (ops/preflight.py): its lines name rank, host and check, one each.

    Exit 3: a node unfit to train on is no reason to retry on it (Kubeflow's ExitCode policy: 1-127 are permanent).
    """

    exit_code = 3

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))


# Kubeflow's exit code for "retry me" (128 + SIGUSR1, also a Slurm pre-emption's clean stop): the Training
# Operator restarts a pod that exits with it (ExitCode), the chart's Indexed Job replaces it (counted against
# backoffLimit), and the Slurm script requeues the job.
RETRY_EXIT = 138


class PeerLost(Exception):
    """A collective failed because another rank is gone (its process, pod or node died without a word).

    This rank cannot go on, and alone it cannot stop at a checkpoint (that needs every rank); it exits with
    RETRY_EXIT so that the launcher restarts the whole world, which resumes from the last checkpoint.
    """

    exit_code = RETRY_EXIT
