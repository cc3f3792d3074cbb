"""Opening URLs: local paths, file://, http(s)://, gs://, s3://, ais:// (outages waited out, reads resumed
mid-stream), pipe: and the rest."""

from __future__ import annotations

import io
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import BinaryIO

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.resumable import Opened, ResumableReader, Transient, buffered

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


def join(base: str, name: str) -> str:
    """Resolve `name` relative to the directory URL or path `base` (absolute names pass through)."""
    if is_url(name) or name.startswith("/") or name.startswith("file://"):
        return name
    if is_url(base) or base.startswith("file://"):
        return base.rstrip("/") + "/" + name  # any scheme, gs:// included (urljoin knows only some)
    return os.path.join(base, name)


def parent(location: str) -> str:
    """The directory URL or path containing `location`."""
    if is_url(location) or location.startswith("file://"):
        return location.rsplit("/", 1)[0]
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


def http_opener(url: str, timeout: float = HTTP_TIMEOUT_S) -> Callable[[int], Opened]:
    """`open_at(position)` for an HTTP(S) URL: a GET, with a Range request past the first byte."""

    def open_at(position: int) -> Opened:
        request = urllib.request.Request(url)
        if position:
            request.add_header("Range", f"bytes={position}-")
        try:
            response = urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as error:
            if error.code >= 500 or error.code in (408, 429):
                raise Transient(f"HTTP {error.code} {error.reason}") from None
            raise ImagenetTrainError(f"{url}: HTTP {error.code} {error.reason}") from None
        if position and response.status != 206:
            response.close()
            raise ImagenetTrainError(f"{url}: server ignored a Range request; cannot resume")
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        size = int(total) if total.isdigit() else (response.length if not position else None)
        return Opened(response, response.length, size)

    return open_at


def open_stream(location: str, io_timeout: float = 900.0) -> BinaryIO:
    """Open a URL or path for sequential binary reading; remote reads wait out outages for `io_timeout` s."""
    scheme = urllib.parse.urlsplit(location).scheme
    if scheme in ("http", "https"):
        return buffered(ResumableReader(location, http_opener(location), io_timeout))
    if scheme == "gs":
        from imagenet_train.io import gcs

        return buffered(ResumableReader(location, gcs.opener(location), io_timeout))
    if scheme == "s3":
        from imagenet_train.io import s3

        return buffered(ResumableReader(location, s3.opener(location), io_timeout))
    if scheme == "ais":
        http_url = ais_http_url(location)
        return buffered(ResumableReader(location, http_opener(http_url), io_timeout))
    if is_url(location):
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


def stream_size(stream: BinaryIO) -> int | None:
    """The size of the object behind an opened stream, where it is known."""
    size = getattr(getattr(stream, "raw", stream), "size", None)
    if size is None and hasattr(stream, "fileno"):
        try:
            return os.fstat(stream.fileno()).st_size
        except (OSError, io.UnsupportedOperation):
            return None
    return size


def read_bytes(location: str, io_timeout: float = 900.0) -> bytes:
    """Read a whole (small) resource, such as a shard index."""
    with open_stream(location, io_timeout=io_timeout) as stream:
        return stream.read()
