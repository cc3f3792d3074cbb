"""A stand-in for Kubeflow Trainer's status server (v2.3.0 pkg/statusserver): HTTPS on a port it picks, one route
`POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/NS/trainjobs/NAME/status` with a bearer token, every body
checked as the API server would check it: the vendored TrainJob CRD's `trainerStatus` schema (strict, int32 and
date-time formats) and its CEL rules. The certificates are made here: a CA, and a server certificate it signs."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jsonschema
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from k8s_checks import _strict
from k8s_rules import cel

INT32 = (-(2**31), 2**31 - 1)


def status_path(namespace: str, name: str) -> str:
    """The route of one TrainJob's status (pkg/statusserver StatusUrl)."""
    return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def trainer_status_schema() -> dict:
    """`status.trainerStatus` of the vendored TrainJob CRD."""
    return cel.crd_schema("TrainJob")["properties"]["status"]["properties"]["trainerStatus"]


def _formats() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker([])

    @checker.checks("int32")
    def int32(value: object) -> bool:
        return not isinstance(value, int) or INT32[0] <= value <= INT32[1]

    @checker.checks("date-time", raises=ValueError)
    def date_time(value: object) -> bool:
        # RFC 3339 with a zone, as metav1.Time parses it (Go's time.RFC3339).
        return not isinstance(value, str) or datetime.datetime.fromisoformat(value).tzinfo is not None

    return checker


def body_problems(body: object) -> list[str]:
    """What the Trainer's server and the API server would refuse in a POSTed body ([] when it is valid)."""
    if not isinstance(body, dict) or set(body) - {"trainerStatus"}:
        return [f"body: expected an object with only trainerStatus, got {body!r}"]
    status = body.get("trainerStatus")
    if status is None:
        return ["body: no trainerStatus (the server accepts it and changes nothing)"]
    schema = trainer_status_schema()
    validator = jsonschema.Draft7Validator(_strict(schema), format_checker=_formats())
    problems = [
        f"trainerStatus.{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(status)
    ]
    return problems + cel.evaluate(status, rs=cel.RuleSet("TrainJob", schema)).problems


def make_pki(folder: Path, host: str = "127.0.0.1", name: str = "test") -> tuple[Path, Path, Path]:
    """A CA and a server certificate for `host` signed by it: (ca.crt, server.crt, server.key)."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} status CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        alt = x509.DNSName(host)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.crt", folder / "server.crt", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


@dataclass
class Received:
    """What the server saw: the valid statuses in order, and every refusal (a test asserts it stays empty)."""

    statuses: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def percentages(self) -> list[int]:
        """progressPercentage of each accepted post, in arrival order."""
        with self.lock:
            return [s["progressPercentage"] for s in self.statuses if "progressPercentage" in s]


class StatusServer:
    """The stand-in server on `host`, serving with `cert`/`key`; `fail_with` answers every post with that code."""

    def __init__(
        self,
        cert: Path,
        key: Path,
        token: str,
        host: str = "127.0.0.1",
        job: str = "test-job",
        namespace: str = "default",
        fail_with: int = 0,
    ):
        self.token, self.path, self.fail_with = token, status_path(namespace, job), fail_with
        self.received = Received()
        self.attempts = 0  # posts with the right path and token, answered or failed on purpose
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet: the test reads `received`
                pass

            def _answer(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _refuse(self, code: int, problem: str) -> None:
                with server.received.lock:
                    server.received.problems.append(problem)
                self._answer(code, {"kind": "Status", "status": "Failure", "message": problem, "code": code})

            def do_GET(self) -> None:
                self._refuse(404, f"GET {self.path}: only POST is served")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(min(length, 1 << 16))
                if self.path != server.path:
                    return self._refuse(404, f"POST {self.path}: expected {server.path}")
                if self.headers.get("Authorization", "").split() != ["Bearer", server.token]:
                    return self._refuse(403, f"Authorization {self.headers.get('Authorization')!r}: not the token")
                server.attempts += 1
                if server.fail_with:
                    self._answer(server.fail_with, {"kind": "Status", "status": "Failure", "code": server.fail_with})
                    return None
                try:
                    body = json.loads(raw)
                except ValueError:
                    return self._refuse(422, f"body {raw[:200]!r}: not JSON")
                problems = body_problems(body)
                if problems:
                    return self._refuse(422, "; ".join(problems))
                with server.received.lock:
                    server.received.statuses.append(body["trainerStatus"])
                return self._answer(200, body)

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://{host}:{self.httpd.server_address[1]}{self.path}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StatusServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
