"""Opening URLs: local paths, file://, http(s)://, gs://, s3://, ais:// (outages waited out, reads resumed
mid-stream), pipe: and the rest."""

from __future__ import annotations

import io
import itertools
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import BinaryIO

from imagenet_train import waiting
from imagenet_train.errors import ImagenetTrainError, clip, visible
from imagenet_train.io import redirects
from imagenet_train.io.pipe import CommandStream
from imagenet_train.io.redirects import RedirectPolicy
from imagenet_train.io.resumable import Opened, ResumableReader, Transient, buffered, stall_window
from imagenet_train.limits import IO_TIMEOUT

HTTP_TIMEOUT_S = 60.0


def is_url(location: str) -> bool:
    """Whether `location` names a remote or piped resource rather than a local path."""
    scheme = urllib.parse.urlsplit(location).scheme
    return location.startswith("pipe:") or (len(scheme) > 1 and scheme != "file")


def local_path(location: str) -> str:
    """The filesystem path for a plain path or file:// URL."""
    if location.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlsplit(location).path)
    return location


def outside_reason(name: str) -> str | None:
    """Why `name` does not name a file inside the folder it is read relative to (None when it does).

    An index names its shards relative to its own folder, as wids merges them; a scheme, a host, an absolute
    path or a `..` that climbs out would let whoever wrote the index make a node run a command (pipe:) or read
    its own files. Percent-escapes are decoded first, since a web server decodes them too.
    """
    if not name:
        return "is empty"
    for text in dict.fromkeys((name, urllib.parse.unquote(name))):
        if not text.isprintable():
            return "holds control characters"
        if text.startswith(("/", "\\")):
            return "is an absolute path"
        first = text.split("/", 1)[0]
        if ":" in first:  # pipe:, file:, http:, gs:, C: and the like all name something else than a file here
            return "names a scheme (pipe:, file:, http:, ...)"
        depth = 0
        for part in text.split("/"):
            depth += -1 if part == ".." else 0 if part in ("", ".") else 1
            if depth < 0:
                return "climbs out of the index's folder with '..'"
    return None


def join(base: str, name: str, trusted: bool = False) -> str:
    """Resolve `name` relative to the directory URL or path `base`; `trusted` lets absolute names and
    other schemes through unchanged (names inside the folder only, otherwise)."""
    if trusted and (is_url(name) or name.startswith("/") or name.startswith("file://")):
        return name
    reason = outside_reason(name)
    if reason and not trusted:
        raise ImagenetTrainError(f"'{clip(name)}' {reason}; expected a name inside {clip(base)}")
    if is_url(base) or base.startswith("file://"):
        return base.rstrip("/") + "/" + name  # any scheme, gs:// included (urljoin knows only some)
    return os.path.join(base, name)


def parent(location: str) -> str:
    """The directory URL or path containing `location` (a URL's query and fragment dropped)."""
    if location.startswith("pipe:"):
        return location.rsplit("/", 1)[0]
    if is_url(location) or location.startswith("file://"):
        parts = urllib.parse.urlsplit(location)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rsplit("/", 1)[0], "", ""))
    return os.path.dirname(os.path.abspath(location))


def ais_http_url(location: str) -> str:
    """ais://BUCKET/OBJECT → AIStore's HTTP object API on AIS_ENDPOINT (the proxy redirects to a target)."""
    endpoint = os.environ.get("AIS_ENDPOINT", "").rstrip("/")
    if not endpoint:
        raise ImagenetTrainError(f"{location}: set AIS_ENDPOINT to the AIStore proxy (e.g. http://ais-proxy:51080)")
    bucket, _, name = location[len("ais://") :].partition("/")
    if not bucket or not name:
        raise ImagenetTrainError(f"{location}: expected ais://BUCKET/OBJECT")
    return f"{endpoint}/v1/objects/{bucket}/{urllib.parse.quote(name)}?provider=ais"


IO_ENVIRONMENT = (
    "STORAGE_EMULATOR_HOST",
    "GOOGLE_",
    "CLOUDSDK_",
    "AIS_",
    "AWS_",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_",
    "REQUESTS_CA_BUNDLE",
)


def io_environment() -> dict[str, str]:
    """The variables that decide where and how URLs are reached (credentials, endpoints, proxies)."""
    return {k: v for k, v in os.environ.items() if k.startswith(IO_ENVIRONMENT)}


def apply_io_environment(snapshot: dict[str, str]) -> None:
    """Make this process's I/O environment the snapshot's.

    DataLoader workers come from a forkserver whose environment is the one it started with; a
    variable set later in the training process (an endpoint, a key file) would otherwise never
    reach them.
    """
    for key in [k for k in os.environ if k.startswith(IO_ENVIRONMENT) and k not in snapshot]:
        del os.environ[key]
    os.environ.update(snapshot)


def http_opener(
    url: str, timeout: float = HTTP_TIMEOUT_S, policy: RedirectPolicy = RedirectPolicy.FOLDER
) -> Callable[[int], Opened]:
    """`open_at(position)` for an HTTP(S) URL: a GET, with a Range request past the first byte; redirects
    are followed only where `policy` allows (io/redirects.py)."""

    def open_at(position: int) -> Opened:
        current, client = url, redirects.opener()
        for hops in itertools.count():
            request = urllib.request.Request(current)
            if position:
                request.add_header("Range", f"bytes={position}-")
            try:
                response = client.open(request, timeout=timeout)
                break
            except urllib.error.HTTPError as error:
                error.close()
                if error.code in redirects.REDIRECT_CODES:
                    current = redirects.follow(
                        url, current, error.headers.get("Location"), hops, policy, outside_reason
                    )
                    continue
                reason = clip(str(error.reason), 200)  # the server's own words: no escape sequence reaches a terminal
                if error.code >= 500 or error.code in (408, 429):
                    raise Transient(f"HTTP {error.code} {reason}") from None
                raise ImagenetTrainError(f"{visible(url)}: HTTP {error.code} {reason}") from None
        if position and response.status != 206:
            response.close()
            raise ImagenetTrainError(f"{url}: server ignored a Range request; cannot resume")
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        size = int(total) if total.isdigit() else (response.length if not position else None)
        return Opened(response, response.length, size)

    return open_at


def socket_timeout(io_timeout: float) -> float:
    """A connection's inactivity timeout: the stall window, and never past the caller's deadline (probe --wait)."""
    window = stall_window(io_timeout)
    return max(0.5, waiting.left(window))


def open_stream(location: str, io_timeout: float = IO_TIMEOUT) -> BinaryIO:
    """Open a URL or path for sequential binary reading; remote reads wait out outages for `io_timeout` s."""
    scheme = urllib.parse.urlsplit(location).scheme
    if scheme in ("http", "https"):
        return buffered(ResumableReader(location, http_opener(location, socket_timeout(io_timeout)), io_timeout))
    if scheme == "gs":
        from imagenet_train.io import gcs

        return buffered(ResumableReader(location, gcs.opener(location), io_timeout))
    if scheme == "s3":
        from imagenet_train.io import s3

        return buffered(ResumableReader(location, s3.opener(location), io_timeout))
    if scheme == "ais":
        http_url = ais_http_url(location)
        opener = http_opener(http_url, socket_timeout(io_timeout), RedirectPolicy.SAME_OBJECT)
        return buffered(ResumableReader(location, opener, io_timeout))
    if location.startswith("pipe:"):
        return io.BufferedReader(CommandStream(location), buffer_size=1 << 20)
    if is_url(location):
        # The schemes we have no reader of our own for (sftp, ftps, scp, hf, htgs): webdataset's gopen (the
        # reason pyproject.toml keeps webdataset).
        import webdataset

        try:
            return webdataset.gopen(location, "rb")
        except Exception as error:  # gopen raises bare exceptions for unknown schemes
            raise ImagenetTrainError(f"{location}: cannot open ({error})") from None
    path = local_path(location)
    try:
        return open(path, "rb", buffering=1 << 20)
    except OSError as error:
        raise ImagenetTrainError(f"{path}: cannot open ({error.strerror})") from None


def stream_size(stream: object) -> int | None:
    """The size of the object behind an opened stream, where it is known."""
    size = getattr(getattr(stream, "raw", stream), "size", None)
    fileno = getattr(stream, "fileno", None)
    if size is None and fileno is not None:
        try:
            return os.fstat(fileno()).st_size
        except (OSError, io.UnsupportedOperation):
            return None
    return size


def read_bytes(location: str, io_timeout: float = IO_TIMEOUT, limit: int = 64 << 20) -> bytes:
    """Read a whole small resource, such as a shard index; more than `limit` bytes is an error, found
    without reading past the limit."""
    chunks: list[bytes] = []
    total = 0
    with open_stream(location, io_timeout=io_timeout) as stream:
        while total <= limit:
            chunk = stream.read(min(1 << 20, limit + 1 - total))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
    raise ImagenetTrainError(f"{clip(location)}: more than {limit} bytes; expected a small metadata file")
