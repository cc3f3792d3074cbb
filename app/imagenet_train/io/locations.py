"""URLs and paths as text: whether a location is a URL, its local path, its folder, a name resolved inside it and
why a name is not one (an index's shard names, a redirect's target). No I/O."""

from __future__ import annotations

import os
import urllib.parse

from imagenet_train.errors import ImagenetTrainError, clip


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
