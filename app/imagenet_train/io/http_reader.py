"""The HTTP(S) reader (a GET, resumed with a Range request; redirects only as io/redirects.py allows) and AIStore's
ais:// URLs as its HTTP object API."""

from __future__ import annotations

import itertools
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

from imagenet_train import waiting
from imagenet_train.errors import ImagenetTrainError, clip, visible
from imagenet_train.io import redirects
from imagenet_train.io.locations import outside_reason
from imagenet_train.io.redirects import RedirectPolicy
from imagenet_train.io.resumable import Opened, Transient, stall_window

HTTP_TIMEOUT_S = 60.0


def ais_http_url(location: str) -> str:
    """ais://BUCKET/OBJECT → AIStore's HTTP object API on AIS_ENDPOINT (the proxy redirects to a target)."""
    endpoint = os.environ.get("AIS_ENDPOINT", "").rstrip("/")
    if not endpoint:
        raise ImagenetTrainError(f"{location}: set AIS_ENDPOINT to the AIStore proxy (e.g. http://ais-proxy:51080)")
    bucket, _, name = location[len("ais://") :].partition("/")
    if not bucket or not name:
        raise ImagenetTrainError(f"{location}: expected ais://BUCKET/OBJECT")
    return f"{endpoint}/v1/objects/{bucket}/{urllib.parse.quote(name)}?provider=ais"


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
