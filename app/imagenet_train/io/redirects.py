"""Which HTTP redirects a shard or index read may follow.

An index names only files beside it (locations.outside_reason); a redirect that urllib follows on its own would
undo that rule, letting the shard server hand the run another host's data, a file: URL or a loop. So urllib
follows none, and the opener follows one only when this module allows it: the same scheme, host and port,
to a path under the folder of the URL first asked for, checked as an index entry is, at most MAX_REDIRECTS
times. An AIStore proxy redirects to the target node that holds the object: another host, but the same
scheme and object path, and the endpoint is the operator's own AIS_ENDPOINT.
"""

from __future__ import annotations

import urllib.parse
import urllib.request
from collections.abc import Callable
from enum import Enum

from imagenet_train.errors import ImagenetTrainError, clip

# Enough for a load balancer and a CDN hop; a loop ends after this many instead of urllib's 10 with no URL.
MAX_REDIRECTS = 5
REDIRECT_CODES = (301, 302, 303, 307, 308)

NameCheck = Callable[[str], "str | None"]  # why a name is not a file inside a folder (None: it is)


class RedirectPolicy(str, Enum):
    """Where a URL's redirects may lead."""

    FOLDER = "folder"  # the same origin, a path under the first URL's folder
    SAME_OBJECT = "same-object"  # an AIStore proxy: any host of the same scheme, the same path

    def __str__(self) -> str:
        return self.value


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Turns every redirect into an HTTPError, for `follow` to judge."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 (urllib's hook)
        return None


def opener() -> urllib.request.OpenerDirector:
    """An urllib opener that follows no redirect by itself (proxies and HTTPS as `urlopen`'s)."""
    return urllib.request.build_opener(_NoRedirects)


def refusal(first: str, target: str, policy: RedirectPolicy, name_reason: NameCheck) -> str | None:
    """Why `first` may not be redirected to `target` (an absolute URL); None when it may. `name_reason` is the
    index's own check of a name inside the folder (locations.outside_reason)."""
    start, to = urllib.parse.urlsplit(first), urllib.parse.urlsplit(target)
    if to.scheme.lower() != start.scheme.lower():
        return f"another scheme ({clip(to.scheme, 20) or 'none'}:)"
    if policy == RedirectPolicy.SAME_OBJECT:
        return None if to.path == start.path and to.netloc else "another object"
    try:
        same_origin = (to.hostname, to.port or _default_port(to.scheme)) == (
            start.hostname,
            start.port or _default_port(start.scheme),
        )
    except ValueError:  # a port that is not a number
        return "a malformed host or port"
    if not same_origin or to.username is not None:
        return "another host or port"
    folder = start.path.rsplit("/", 1)[0] + "/"
    if not to.path.startswith(folder):
        return f"outside the folder {clip(folder)}"
    reason = name_reason(to.path[len(folder) :])
    return f"a name that {reason}" if reason else None


def follow(
    first: str, current: str, location: str | None, hops: int, policy: RedirectPolicy, name_reason: NameCheck
) -> str:
    """The absolute URL a redirect from `current` (after `hops` others from `first`) leads to, or the one-line
    error refusing it."""
    if location is None:
        raise ImagenetTrainError(f"{clip(first, 200)}: a redirect without a Location")
    target = urllib.parse.urljoin(current, location.strip())
    if hops >= MAX_REDIRECTS:
        raise ImagenetTrainError(
            f"{clip(first, 200)}: more than {MAX_REDIRECTS} redirects (the last to {clip(target, 200)}); "
            "a redirect loop?"
        )
    reason = refusal(first, target, policy, name_reason)
    if reason:
        raise ImagenetTrainError(f"{clip(first, 200)}: redirect to {clip(target, 200)} refused: it leads to {reason}")
    return target


def _default_port(scheme: str) -> int | None:
    return {"http": 80, "https": 443}.get(scheme.lower())
