"""Opening URLs: local paths, file://, http(s):// (retried, resumed mid-stream), gs://, pipe: and the rest."""

from __future__ import annotations

import io
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import BinaryIO

from .errors import ImagenetTrainError

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


def _backoff(attempt: int) -> float:
    return min(8.0, 0.25 * 2**attempt)


class HTTPStream(io.RawIOBase):
    """A readable HTTP body that retries the connection and resumes with a Range request after errors."""

    def __init__(self, url: str, retries: int = 5, timeout: float = HTTP_TIMEOUT_S):
        self.url, self.retries, self.timeout = url, retries, timeout
        self.position = 0
        self.response = self._connect()

    def _connect(self):
        last_error = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(_backoff(attempt))
            request = urllib.request.Request(self.url)
            if self.position:
                request.add_header("Range", f"bytes={self.position}-")
            try:
                response = urllib.request.urlopen(request, timeout=self.timeout)
            except urllib.error.HTTPError as error:
                if error.code < 500 and error.code != 429:
                    raise ImagenetTrainError(f"{self.url}: HTTP {error.code} {error.reason}") from None
                last_error = f"HTTP {error.code} {error.reason}"
                continue
            except (urllib.error.URLError, OSError) as error:
                last_error = str(getattr(error, "reason", error))
                continue
            if self.position and response.status != 206:
                raise ImagenetTrainError(f"{self.url}: server ignored a Range request; cannot resume")
            return response
        raise ImagenetTrainError(f"{self.url}: unreachable after {self.retries + 1} attempts ({last_error})")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        for attempt in range(self.retries + 1):
            try:
                count = self.response.readinto(buffer)
                if count == 0 and len(buffer) and self.response.length:
                    # http.client reports a connection closed before Content-Length as a clean EOF.
                    raise ConnectionError(f"connection closed with {self.response.length} bytes unread")
                self.position += count
                return count
            except (OSError, urllib.error.URLError, ValueError) as error:
                if attempt == self.retries:
                    raise ImagenetTrainError(
                        f"{self.url}: read failed at byte {self.position} after retries ({error})"
                    ) from None
                self.response.close()
                time.sleep(_backoff(attempt))
                self.response = self._connect()
        return 0

    def close(self) -> None:
        if not self.closed:
            self.response.close()
        super().close()


def open_stream(location: str, retries: int = 5) -> BinaryIO:
    """Open a URL or path for sequential binary reading; errors name the location."""
    scheme = urllib.parse.urlsplit(location).scheme
    if scheme in ("http", "https"):
        return io.BufferedReader(HTTPStream(location, retries=retries), buffer_size=1 << 20)
    if scheme == "gs":
        from . import gcs

        return gcs.open_read(location)
    if scheme == "s3":
        from . import s3

        return s3.open_read(location, retries=retries)
    if scheme == "ais":
        return io.BufferedReader(HTTPStream(ais_http_url(location), retries=retries), buffer_size=1 << 20)
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


def read_bytes(location: str, retries: int = 5) -> bytes:
    """Read a whole (small) resource, such as a shard index."""
    if location.startswith("gs://"):
        from . import gcs

        return gcs.read_bytes(location)
    with open_stream(location, retries=retries) as stream:
        return stream.read()
