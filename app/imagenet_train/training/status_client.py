"""The client of Kubeflow Trainer's status endpoint: what a report looks like, how one is posted with the bearer
token, and the poster's thread that keeps the network off the training loop.

The endpoint's contract (kubeflow/trainer v2.3.0, pkg/runtime/framework/plugins/trainjobstatus and
pkg/statusserver; v2.2+, TrainJobStatus feature gate): POST JSON `{"trainerStatus": {...}}` to
KUBEFLOW_TRAINER_SERVER_URL, over TLS verified with the CA file named by KUBEFLOW_TRAINER_SERVER_CA_CERT, with
`Authorization: Bearer <token>` read from the file named by KUBEFLOW_TRAINER_SERVER_TOKEN (a projected service
account token that rotates: read again for every post). A failed report is logged at most once a minute and never
reaches the caller.

The token is a credential: a post goes over https only, follows no redirect (a 3xx is a failed report naming the
URL and the Location, never a second request carrying the header), and reads at most REPLY_LIMIT bytes of the
answer."""

from __future__ import annotations

import json
import logging
import math
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from imagenet_train.errors import clip

log = logging.getLogger(__name__)

URL_VAR = "KUBEFLOW_TRAINER_SERVER_URL"
CA_VAR = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
TOKEN_VAR = "KUBEFLOW_TRAINER_SERVER_TOKEN"
TIMEOUT_S = 5.0  # one post: connect, TLS and answer (the server's own read/write timeouts are 10 s)
COMPLAIN_EVERY_S = 60.0  # a failing endpoint is logged at most this often
INT32_MAX = 2**31 - 1
TOKEN_LIMIT = 64 * 1024  # a projected token is ~1 KiB; the file is read with a bound all the same
REPLY_LIMIT = 64 * 1024
REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})


class Redirected(Exception):
    """The endpoint answered with a redirect, which a request carrying the token never follows."""


class _NoRedirectWithToken(urllib.request.HTTPRedirectHandler):
    """Turns every redirect into an HTTPError: urllib's own handler would resend the Authorization header to
    wherever the Location points, http:// included."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 (urllib's hook)
        return None


@dataclass(frozen=True)
class Endpoint:
    """Where and how to post: the URL, the CA file and the token file, as the Trainer injects them."""

    url: str
    ca_file: str
    token_file: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Endpoint | None:
        """The endpoint the Trainer injected; None without one (or, logged, with an incomplete or non-https one)."""
        url, ca, token = env.get(URL_VAR, ""), env.get(CA_VAR, ""), env.get(TOKEN_VAR, "")
        if not (url or ca or token):
            return None
        missing = [name for name, value in ((URL_VAR, url), (CA_VAR, ca), (TOKEN_VAR, token)) if not value]
        if missing:
            log.warning("trainer status: %s unset; progress is not reported", ", ".join(missing))
            return None
        if not url.startswith("https://"):
            log.warning(
                "trainer status: %s=%s is not an https:// URL; https is required for a request that carries the "
                "bearer token, so progress is not reported",
                URL_VAR,
                clip(url, 200),
            )
            return None
        return cls(url, ca, token)

    def post(self, body: dict) -> int:
        """POST one status; returns the HTTP status (raises Redirected for a 3xx, and OSError, ssl.SSLError or
        urllib's errors on other failures)."""
        with open(self.token_file, encoding="utf-8") as stream:
            token = stream.read(TOKEN_LIMIT).strip()
        context = ssl.create_default_context(cafile=self.ca_file)  # per post: the Trainer rotates its certificate
        request = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        # No proxy: the endpoint is the Trainer controller's in-cluster Service, never behind the pod's HTTPS_PROXY.
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context), _NoRedirectWithToken
        )
        try:
            with opener.open(request, timeout=TIMEOUT_S) as reply:
                reply.read(REPLY_LIMIT)
                return reply.status
        except urllib.error.HTTPError as error:
            error.close()
            if error.code not in REDIRECT_CODES:
                raise
            location = clip(str(error.headers.get("Location", "none")), 200)
            raise Redirected(
                f"{clip(self.url, 200)} answered HTTP {error.code} to {location}: not followed, a request carrying "
                "the bearer token follows no redirect"
            ) from None


def status_body(percent: int, remaining_s: float | None, metrics: Mapping[str, float], now: float) -> dict:
    """The `UpdateTrainJobStatusRequest` for one report, within the CRD's bounds (int32, 0-100, 64-char strings)."""
    status: dict = {"progressPercentage": max(0, min(100, int(percent)))}
    if remaining_s is not None and math.isfinite(remaining_s):
        status["estimatedRemainingSeconds"] = max(0, min(INT32_MAX, round(remaining_s)))
    shown = [
        {"name": name[:64], "value": f"{value:.6g}"}
        for name, value in metrics.items()
        if isinstance(value, int | float) and math.isfinite(value)
    ]
    if shown:
        status["metrics"] = shown[:256]
    stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # RFC 3339, metav1.Time's
    return {"trainerStatus": {**status, "lastUpdatedTime": stamp}}


class Poster:
    """Sends the latest status on a daemon thread: a slot of one that a newer status replaces, so `submit` never
    waits on the network and a slow endpoint only means fewer reports."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self.slot: dict | None = None
        self.busy = False
        self.sent = self.failed = 0
        self.last_complaint = -math.inf
        self.cond = threading.Condition()
        threading.Thread(target=self._serve, name="trainer-status", daemon=True).start()

    def submit(self, body: dict) -> None:
        """Queue `body` to be posted, replacing any status not yet sent."""
        with self.cond:
            self.slot = body
            self.cond.notify()

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for what was submitted to be posted (or to fail); True if it was."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.slot is not None or self.busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def _serve(self) -> None:
        while True:
            with self.cond:
                while self.slot is None:
                    self.cond.wait()
                body, self.slot, self.busy = self.slot, None, True
            try:
                self.endpoint.post(body)
                self.sent += 1
            except Exception as error:  # noqa: BLE001 - any failure to report must leave training alone
                self.failed += 1
                self._complain(error)
            finally:
                with self.cond:
                    self.busy = False
                    self.cond.notify_all()

    def _complain(self, error: Exception) -> None:
        now = time.monotonic()
        if now - self.last_complaint < COMPLAIN_EVERY_S:
            return
        self.last_complaint = now
        reason = f"HTTP {error.code} {error.reason}" if isinstance(error, urllib.error.HTTPError) else str(error)
        log.warning(
            "trainer status: cannot report progress to %s (%s); training goes on (next warning in %ds at the soonest)",
            clip(self.endpoint.url, 200),
            clip(reason, 300),  # the server's reason phrase: its control characters shown, never sent to the terminal
            COMPLAIN_EVERY_S,
        )
