"""One redaction of secrets, wherever a URL is serialised (config.json, checkpoints, tracker params, log and
error lines): a URL's user info and its signed or secret query values become MARK.

It works on any text, a single URL, a URL spec (`http://u:p@h/x-{0..9}.tar?sig=...`) or a log line naming
several, and leaves everything else as it is. Signed URLs carry their credential in the query string (S3's
X-Amz-Signature, GCS's X-Goog-Signature, Azure's sig); a password in user info is the older form. What a
resume or `--config` needs to read again comes from the command line, never from a redacted record:
`is_redacted` tells a value that went through here, so a record's value is refused in one line, not used.
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from typing import Any

MARK = "***"

# Query parameter names whose values are credentials, compared case-insensitively (docs/security.md lists them).
SECRET_PARAMETERS = frozenset(
    {
        "sig",  # Azure SAS
        "signature",  # S3's query-string auth v2, CloudFront
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "awsaccesskeyid",
        "x-goog-signature",
        "x-goog-credential",
        "googleaccessid",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "auth",
        "authorization",
        "key",
        "api_key",
        "apikey",
        "password",
        "passwd",
        "pwd",
        "secret",
        "client_secret",
    }
)

# scheme://USERINFO@ : the user info runs to the authority's last '@' (a password may hold an unescaped one).
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]*)@")
# ?NAME=VALUE or &NAME=VALUE (or ;) up to the next separator, space, quote or fragment, or a `::` that starts the
# next URL of a spec: a value of another parameter never swallows the secret parameters after it.
_PARAMETER = re.compile(r"(?P<lead>[?&;])(?P<name>[^=&;#?\s'\"]+)=(?P<value>(?:(?!::)[^&;#?\s'\"<>])*)")


def _secret(name: str) -> bool:
    return urllib.parse.unquote(name).casefold() in SECRET_PARAMETERS


def _hide_parameter(match: re.Match) -> str:
    if not _secret(match["name"]) or not match["value"]:
        return match[0]
    return f"{match['lead']}{match['name']}={MARK}"


def redact(text: str) -> str:
    """`text` with every URL's user info and secret query values replaced by MARK (other text unchanged)."""
    if "@" not in text and "=" not in text:  # the common case, a plain path or word: nothing to look for
        return text
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MARK}@" if m["userinfo"] else m[0], text)
    return _PARAMETER.sub(_hide_parameter, text)


def redacted(values: Any) -> Any:
    """`values` (a record: mappings and lists of plain data) with every text in it redacted."""
    if isinstance(values, str):
        return redact(values)
    if isinstance(values, dict):
        return {key: redacted(value) for key, value in values.items()}
    if isinstance(values, list | tuple):
        return [redacted(value) for value in values]
    return values


def is_redacted(text: str) -> bool:
    """Whether `text` holds a value `redact` replaced: a URL whose user info or a secret query value is MARK."""
    if any(m["userinfo"] == MARK for m in _USERINFO.finditer(text)):
        return True
    return any(m["value"] == MARK and _secret(m["name"]) for m in _PARAMETER.finditer(text))


def credentials(url: str) -> tuple[str, str, str]:
    """A URL's user and password (percent-decoded; "" when absent) and the URL without them."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return "", "", url
    host = parts.netloc.rpartition("@")[2]
    plain = urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or ""), plain


class RedactingFormatter(logging.Formatter):
    """A log formatter whose lines (message, arguments and traceback alike) pass through `redact`."""

    def format(self, record: logging.LogRecord) -> str:
        """The formatted record, redacted."""
        return redact(super().format(record))


def redact_logs(fmt: str | None = None) -> None:
    """Make every log line this process writes pass through `redact`: the root logger's handlers (formatted with
    `fmt`) and logging's last resort, which prints a process's warnings when it configured no handler (a
    DataLoader worker)."""
    if logging.lastResort is not None:
        logging.lastResort.setFormatter(RedactingFormatter())
    for handler in logging.getLogger().handlers:
        handler.setFormatter(RedactingFormatter(fmt))
