"""What a tracker's server may do to rank 0: answer at most REPLY_LIMIT bytes, never redirect a request that
carries credentials, and never receive those credentials over plain http.

MLflow talks to its server through `requests` sessions it makes itself, and reads every answer whole before
looking at it: a hostile or broken server answering 256 MiB raised rank 0's peak RSS by ~800 MB (issue 46). Its
sessions get a response hook here that refuses a declared length over the limit before reading a byte and stops
reading an undeclared one at the limit (the answers urllib3 drains before a retry, a 5xx, it reads in 64 KiB pieces
and drops). A refused answer is an exception like any other failed call: one warning, and training goes on.

W&B's network traffic leaves from its own service process (wandb-core), not from rank 0.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from imagenet_train.errors import ImagenetTrainError, clip

# The largest answer read from a tracker: MLflow's answers are a run's params, tags and latest metrics (a few
# hundred KB for the biggest runs); anything past this is no answer of a tracker.
REPLY_LIMIT = 8 << 20
# Set unless the user set them: a request carrying MLflow's credentials follows no redirect.
MLFLOW_REDIRECTS = {"MLFLOW_ALLOW_HTTP_REDIRECTS": "false"}
# Where each tracker's server is named, and the variables that make its library send credentials to it.
SERVER_VARS = {"mlflow": "MLFLOW_TRACKING_URI", "wandb": "WANDB_BASE_URL"}
CREDENTIAL_VARS = {
    "mlflow": ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"),
    "wandb": ("WANDB_API_KEY",),
}


class ReplyTooLarge(Exception):
    """A tracker's server answered more than REPLY_LIMIT bytes."""


def check_transport(tracker: str, env: Mapping[str, str] = os.environ) -> None:
    """Refuse a tracker whose credentials would cross the network in clear text: a plain http:// server (other
    than one on this host) with a token, a user name, a password or an API key set for it."""
    variable = SERVER_VARS.get(tracker)
    server = env.get(variable, "") if variable else ""
    parts = urllib.parse.urlsplit(server)
    if parts.scheme.lower() != "http" or _loopback(parts.hostname or ""):
        return
    sent = [name for name in CREDENTIAL_VARS.get(tracker, ()) if env.get(name)]
    sent += ["a user name or password in the URL"] if parts.username or parts.password else []
    if sent:
        where = clip(f"http://{parts.hostname}{f':{parts.port}' if parts.port else ''}", 120)  # no user, no query
        raise ImagenetTrainError(
            f"--tracker {tracker}: {variable}={where} is plain http, and {', '.join(sent)} would travel in clear "
            "text; https is required for a tracker that is sent credentials"
        )


def _loopback(host: str) -> bool:
    """Whether `host` is this machine (its traffic never reaches a network another host can read)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bound_mlflow() -> None:
    """Make every HTTP session MLflow makes in this process read bounded answers and follow no redirect."""
    for key, value in MLFLOW_REDIRECTS.items():
        os.environ.setdefault(key, value)
    from mlflow.utils import request_utils

    original = request_utils._get_request_session
    if getattr(original, "bounded", False):
        return

    @functools.wraps(original)
    def bounded(*args: Any, **kwargs: Any):
        session = original(*args, **kwargs)  # cached by MLflow: the hook is added once per session
        if _capped not in session.hooks["response"]:
            session.hooks["response"].append(_capped)
        return session

    bounded.bounded = True  # type: ignore[attr-defined]  # a mark on the function: mypy types no function attributes
    request_utils._get_request_session = bounded


def _capped(response, *args: Any, stream: bool = False, **kwargs: Any):
    """A `requests` response hook: an answer read whole is refused past REPLY_LIMIT bytes (decoded)."""
    if stream:  # the caller reads it piece by piece itself
        return response
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > REPLY_LIMIT:
        response.close()
        raise ReplyTooLarge(_too_large(f"declared {int(declared)} bytes"))
    response.raw = _CappedBody(response.raw)
    return response


def _too_large(what: str) -> str:
    return f"an answer over {REPLY_LIMIT} bytes ({what}); not read further"  # MLflow's error names the URL


class _CappedBody:
    """urllib3's response body, whose reads fail once more than REPLY_LIMIT bytes came."""

    def __init__(self, raw: Any):
        self._raw, self._count = raw, 0

    def _counted(self, chunk: bytes) -> bytes:
        self._count += len(chunk)
        if self._count > REPLY_LIMIT:
            self._raw.close()
            raise ReplyTooLarge(_too_large("cut off there"))
        return chunk

    def stream(self, amount: int = 2**16, decode_content: bool | None = None) -> Iterator[bytes]:
        """The body piece by piece, decoded, as `requests` reads it."""
        for chunk in self._raw.stream(amount, decode_content=decode_content):
            yield self._counted(chunk)

    def read(self, amount: int | None = None, *args: Any, **kwargs: Any) -> bytes:
        """Up to `amount` bytes (all that is left, at most the limit, without)."""
        return self._counted(self._raw.read(REPLY_LIMIT + 1 if amount is None else amount, *args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)
