"""The storage schemes, one entry each: how a URL of the scheme is read, what writes to it (upload, sync, --results)
where anything does, and which environment variables its loader workers must see.

Adding a read-only scheme is one entry in SCHEMES (docs/development.md, "Adding a storage scheme"): io/storage.py
opens every URL through this table, the loader's workers get the entry's variables (storage.io_environment), and a
URL naming a scheme the table lacks is refused in one line when the settings are read (`check_settings`, from
main/entry_checks.py) and when an index is loaded.
"""

from __future__ import annotations

import io
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from imagenet_train.errors import ImagenetTrainError, clip
from imagenet_train.io import gcs, s3
from imagenet_train.io.http_reader import ais_http_url, http_opener, socket_timeout
from imagenet_train.io.locations import local_path
from imagenet_train.io.pipe import CommandStream
from imagenet_train.io.redirects import RedirectPolicy
from imagenet_train.io.resumable import ResumableReader, buffered
from imagenet_train.redact import redact

Opener = Callable[[str, float], BinaryIO]  # (url, io_timeout) -> a stream read from the start

# What every networked scheme's client reads to reach its server: proxies and the CA bundle.
NETWORK = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_",
    "REQUESTS_CA_BUNDLE",
)


class Writer(Protocol):
    """What upload, sync, `shards` to a bucket and the --results mirror need of a scheme (io/gcs.py is one)."""

    def split(self, url: str) -> tuple[str, str]:
        """URL -> (bucket, path); a malformed URL is one line."""

    def listing(self, url: str, io_timeout: float = ...) -> list[gcs.ObjectInfo]:
        """Every object under a prefix."""

    def stat(self, url: str, io_timeout: float = ...) -> gcs.ObjectInfo | None:
        """One object's size and checksum, or None."""

    def file_crc32c(self, path: str) -> str:
        """A local file's checksum, as `stat` and `listing` report an object's."""

    def upload(self, path: str, url: str, io_timeout: float = ...) -> gcs.ObjectInfo:
        """Copy a local file to `url`, verified."""

    def download(self, url: str, path: str, io_timeout: float = ..., private: bool = False) -> gcs.ObjectInfo:
        """Copy an object to a local file, verified."""


@dataclass(frozen=True)
class Scheme:
    """One storage scheme: its reader, its writer (None: read only) and its loader workers' variables."""

    name: str  # as a URL spells it before ':' ("file" also stands for a plain path)
    opens: Opener
    environment: tuple[str, ...] = ()  # variable names, or prefixes ending in '_', copied into loader workers
    writer: Writer | None = None  # the module that lists, uploads and downloads (None: read only)
    shown: str = ""  # how the docs and errors write it: "gs://" (default: NAME://)

    @property
    def spelled(self) -> str:
        """'gs://', 'pipe:' — the scheme as a URL starts with it."""
        return self.shown or f"{self.name}://"


def _open_local(location: str, io_timeout: float) -> BinaryIO:
    path = local_path(location)
    try:
        return open(path, "rb", buffering=1 << 20)
    except OSError as error:
        raise ImagenetTrainError(f"{path}: cannot open ({error.strerror})") from None


def _open_http(location: str, io_timeout: float) -> BinaryIO:
    return buffered(ResumableReader(location, http_opener(location, socket_timeout(io_timeout)), io_timeout))


def _open_gs(location: str, io_timeout: float) -> BinaryIO:
    return buffered(ResumableReader(location, gcs.opener(location), io_timeout))


def _open_s3(location: str, io_timeout: float) -> BinaryIO:
    return buffered(ResumableReader(location, s3.opener(location), io_timeout))


def _open_ais(location: str, io_timeout: float) -> BinaryIO:
    opener = http_opener(ais_http_url(location), socket_timeout(io_timeout), RedirectPolicy.SAME_OBJECT)
    return buffered(ResumableReader(location, opener, io_timeout))


def _open_pipe(location: str, io_timeout: float) -> BinaryIO:
    return io.BufferedReader(CommandStream(location), buffer_size=1 << 20)


SCHEMES: dict[str, Scheme] = {
    scheme.name: scheme
    for scheme in (
        Scheme("file", _open_local, shown="file:// (or a plain path)"),
        Scheme("http", _open_http, NETWORK),
        Scheme("https", _open_http, NETWORK),
        Scheme("gs", _open_gs, ("STORAGE_EMULATOR_HOST", "GOOGLE_", "CLOUDSDK_", *NETWORK), gcs),
        Scheme("s3", _open_s3, ("AWS_", *NETWORK)),
        Scheme("ais", _open_ais, ("AIS_", *NETWORK)),
        Scheme("pipe", _open_pipe, shown="pipe:"),
    )
}


def name_of(location: str) -> str:
    """The scheme a URL or path names: 'gs', 'pipe', 'file' for a plain path (a drive letter is no scheme)."""
    if location.startswith("pipe:"):
        return "pipe"
    try:
        scheme = urllib.parse.urlsplit(location).scheme
    except ValueError:  # an unbalanced '[' in the host: no scheme this table could read either
        scheme = location.partition(":")[0].casefold()
    return scheme if len(scheme) > 1 else "file"


def known(writable: bool = False) -> str:
    """The schemes as an error line lists them ('file:// (or a plain path), http://, ...'); `writable`: those with a
    writer."""
    return ", ".join(s.spelled for s in SCHEMES.values() if s.writer or not writable)


def scheme_for(location: str, what: str = "") -> Scheme:
    """The table's entry for `location`'s scheme; one line naming `what` (a flag, a file), the URL (redacted) and
    the schemes known, for a scheme the table lacks."""
    name = name_of(location)
    if name not in SCHEMES:
        raise _unknown(location, name, what)
    return SCHEMES[name]


def _unknown(location: str, name: str, what: str) -> ImagenetTrainError:
    at = f"{what}: " if what else ""
    return ImagenetTrainError(
        f"{at}'{clip(redact(location))}' names the scheme '{clip(name, 20)}:', which has no reader here; "
        f"expected one of: {known()} (docs/data.md, Shard URLs)"
    )


def writer_for(location: str, what: str = "") -> Writer:
    """The writer of `location`'s scheme; one line naming `what`, the URL (redacted) and the schemes that have
    one, where the scheme has none."""
    scheme = scheme_for(location, what)
    if scheme.writer is None:
        at = f"{what}: " if what else ""
        raise ImagenetTrainError(
            f"{at}'{clip(redact(location))}' names {scheme.spelled}, which is read only here; expected a URL of a "
            f"scheme with a writer: {known(writable=True)}"
        )
    return scheme.writer


def check_settings(shards: str, train_urls: str, val_urls: str, results: str) -> None:
    """Every URL setting names a scheme this table reads (--shards, --train-urls, --val-urls), and --results one
    it writes."""
    if shards:
        scheme_for(shards, "--shards")
    check_spec("--train-urls", train_urls)
    check_spec("--val-urls", val_urls)
    if results:
        writer_for(results, "--results")


def check_spec(what: str, spec: str) -> None:
    """Refuse a setting's URL spec (brace notation, `::` lists) that names a scheme the table lacks, in one line.

    Only the text up to each URL's first ':' (and the end of the braces that ':' may stand in) is expanded, never
    the shard numbers: braceexpand builds every range whole before the first name comes out."""
    for part in filter(None, spec.split("::")):
        if not _balanced(part):
            raise ImagenetTrainError(
                f"{what}: '{clip(redact(part))}': unbalanced braces; expected pairs, as in "
                "'http://h/train-{000000..000146}.tar'"
            )
        for name in dict.fromkeys(_schemes_named(part, what)):
            if name not in SCHEMES:
                raise _unknown(part, name, what)


def _balanced(text: str) -> bool:
    """Whether every '{' of a spec closes, as braceexpand needs (a backslash escapes the next character)."""
    depth, escaped = 0, False
    for char in text:
        if not escaped and char in "{}":
            depth += 1 if char == "{" else -1
            if depth < 0:
                return False
        escaped = not escaped and char == "\\"
    return depth == 0


def _schemes_named(part: str, what: str) -> list[str]:
    """The schemes one URL spec's alternatives name ('file' for paths)."""
    head = part.split("/", 1)[0]
    if ":" not in head:
        return ["file"]  # a path: no expansion of it names a scheme
    end, depth = head.index(":"), head[: head.index(":")].count("{") - head[: head.index(":")].count("}")
    while depth > 0 and end + 1 < len(head):  # the ':' is inside braces: up to where they close
        end += 1
        depth += {"{": 1, "}": -1}.get(head[end], 0)
    candidate = head[: end + 1]
    if "{" not in candidate and "}" not in candidate:
        return [name_of(candidate)]
    if ".." in candidate or len(candidate) > 64 or depth:
        raise ImagenetTrainError(
            f"{what}: '{clip(redact(part))}': braces around the scheme; expected them in the shard names "
            "(e.g. 'http://h/train-{000000..000146}.tar')"
        )
    from braceexpand import braceexpand

    return [name_of(each) for each in braceexpand(candidate)]


def worker_environment() -> tuple[str, ...]:
    """Every variable name and prefix some scheme's loader workers need, each once, in the table's order."""
    return tuple(dict.fromkeys(variable for scheme in SCHEMES.values() for variable in scheme.environment))
