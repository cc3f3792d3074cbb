"""Images built for real with podman, shared by the image test (tests/integration/test_image.py) and the
end-to-end run of the chart's pods (tests/e2e).

No registry can be pulled from here, so the bases are stand-ins made from Debian with mmdebstrap and cached
as images between runs:
- the CUDA PyTorch base of images/train/Dockerfile: Debian bookworm with CPU torch (the local wheel) and the
  registry's torchvision (tests/image/Containerfile.testbase), passed as BASE_IMAGE to `make build`;
- nginxinc/nginx-unprivileged, the chart's shard server: Debian's nginx run as uid 101 on port 8080
  (tests/image/Containerfile.nginx-standin).
The training image itself is built by the documented release path, `make build`, from a copy of the checkout
with planted secrets and run output that must never reach a layer. Its name is this checkout's own, so
sessions in other worktrees never remove an image this one is running. `make push` sends it to Debian's
docker-registry started on 127.0.0.1 over TLS (LocalRegistry), from which it is pulled back by digest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from imagenet_train.ops.serve import free_port

REPO = Path(__file__).resolve().parents[1]
STAGE0 = "localhost/imagenet-train-stage0:bookworm"
TESTBASE = "localhost/imagenet-train-testbase:torch2.13.0-nvidia-entrypoint"
NGINX_ROOTFS = "localhost/imagenet-train-nginx-rootfs:bookworm"
NGINX_STANDIN = "localhost/nginx-unprivileged-standin:bookworm"
# The image under test: named after this checkout, tagged as `make build TAG=image-test` tags it.
IMAGE_REPOSITORY = "localhost/imagenet-train-" + hashlib.sha256(str(REPO).encode()).hexdigest()[:8]
IMAGE = f"{IMAGE_REPOSITORY}:image-test"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# podman here needs runc, cgroupfs and explicit ulimits (no systemd, no default nofile/nproc limits).
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""


def torch_wheel() -> Path | None:
    """The local CPU torch 2.13.0 wheel the stand-in base installs (PIP_FIND_LINKS or /opt/wheels)."""
    for folder in [*os.environ.get("PIP_FIND_LINKS", "").split(), "/opt/wheels"]:
        found = sorted(Path(folder).glob("torch-2.13.0+cpu-cp311-*.whl")) if Path(folder).is_dir() else []
        if found:
            return found[0]
    return None


def missing_tools() -> str:
    """Why images cannot be built here ("" when they can)."""
    if not shutil.which("podman") or not shutil.which("mmdebstrap"):
        return "podman/mmdebstrap not installed (make image-deps installs them as root)"
    if torch_wheel() is None:
        return "no local CPU torch 2.13.0 wheel to build the stand-in base image from"
    return ""


def registry_missing() -> str:
    """Why no local registry can be started here ("" when it can)."""
    if not shutil.which("docker-registry") or not shutil.which("openssl"):
        return "docker-registry/openssl not installed (make image-deps installs docker-registry as root)"
    return ""


class Podman:
    """`podman ARGS` with this machine's containers.conf; a failure raises with podman's message."""

    def __init__(self, config_dir: Path):
        config_dir.mkdir(parents=True, exist_ok=True)
        (config_dir / "containers.conf").write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(config_dir / "containers.conf")}

    def __call__(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        result = subprocess.run(["podman", *args], capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"podman {' '.join(args[:3])} failed ({result.returncode}):\n{result.stderr[-4000:]}")
        return result

    def exists(self, image: str) -> bool:
        return self("image", "exists", image, check=False).returncode == 0


def debian_image(engine: Podman, tmp: Path, ref: str, include: str) -> None:
    """A Debian bookworm minbase root filesystem with `include` (mmdebstrap), imported as `ref` once."""
    if engine.exists(ref):
        return
    rootfs = tmp / f"rootfs-{os.getpid()}.tar"
    command = ["mmdebstrap", "--quiet", "--variant=minbase", f"--include={include}", "bookworm", str(rootfs)]
    subprocess.run(command, check=True, timeout=600)
    engine("import", str(rootfs), ref)
    rootfs.unlink()


def _containerfile(engine: Podman, name: str, ref: str, *flags: str) -> None:
    if not engine.exists(ref):
        folder = REPO / "tests" / "image"
        engine("build", "--pull=never", "--network=host", "-f", str(folder / name), *flags, "-t", ref, str(folder))


def testbase(engine: Podman, tmp: Path) -> str:
    """The stand-in CUDA PyTorch base (cached)."""
    debian_image(engine, tmp, STAGE0, "python3,python3-venv,ca-certificates")
    wheel = torch_wheel()
    mounts = ["-v", f"{wheel.parent}:/wheels:ro", "-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"]
    _containerfile(engine, "Containerfile.testbase", TESTBASE, *mounts)
    return TESTBASE


def nginx_standin(engine: Podman, tmp: Path) -> str:
    """The stand-in for nginxinc/nginx-unprivileged: Debian's nginx as uid 101 on 8080 (cached)."""
    debian_image(engine, tmp, NGINX_ROOTFS, "nginx")
    _containerfile(engine, "Containerfile.nginx-standin", NGINX_STANDIN)
    return NGINX_STANDIN


def build_context(tmp: Path) -> Path:
    """The repo's tracked files plus planted secrets and run output that must never reach the image."""
    context = tmp / "context"
    tracked_and_new = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    files = subprocess.run(tracked_and_new, cwd=REPO, capture_output=True, text=True, check=True)
    for name in filter(None, files.stdout.split("\0")):
        source, target = REPO / name, context / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        elif source.exists():
            shutil.copy2(source, target)
    (context / "app" / "google-key.json").write_text(
        '{"type": "service_account", "private_key": "planted-secret-7f3a9c"}'
    )
    (context / "runs" / "r1").mkdir(parents=True)
    (context / "runs" / "r1" / "metrics.jsonl").write_text("{}\n")
    return context


@dataclass
class BuiltImage:
    """The training image under test and the engine that built it."""

    engine: Podman
    ref: str
    revision: str


def build_training_image(engine: Podman, tmp: Path) -> BuiltImage:
    """images/train/Dockerfile on the stand-in base, by `make build` with the flags this machine needs."""
    base = testbase(engine, tmp)
    revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    flags = f"--pull=never --network=host -v {CA_BUNDLE}:{CA_BUNDLE}:ro"
    built = subprocess.run(
        [
            "make",
            "-C",
            str(build_context(tmp)),
            "build",
            "CONTAINER=podman",
            f"BASE_IMAGE={base}",
            f"IMAGE={IMAGE_REPOSITORY}",
            "TAG=image-test",
            f"REVISION={revision}",
            f"BUILD_FLAGS={flags}",
        ],
        env=engine.env,
        timeout=900,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-4000:]
    return BuiltImage(engine, IMAGE, revision)


def remove_training_image(engine: Podman) -> None:
    """Remove the image under test and the builder stages it left (the cached bases stay)."""
    engine("rmi", "--force", IMAGE, check=False)
    engine("image", "prune", "--force", "--filter", "label=org.imagenet-train.stage=builder", check=False)


class LocalRegistry:
    """Debian's docker-registry (distribution 2.8) on 127.0.0.1 over TLS, storing under `folder`.

    Its certificate is self-signed for 127.0.0.1 (and any `names`, host names a client maps to 127.0.0.1 itself)
    and `cert_dir` holds it as ca.crt, which is what podman's --cert-dir reads (Helm's --ca-file takes that file):
    pushes and pulls verify TLS for real. Started and stopped by its PID (a context manager).
    """

    def __init__(self, folder: Path, names: tuple[str, ...] = ()):
        self.folder = folder
        self.names = names
        self.storage = folder / "storage"
        self.cert_dir = folder / "certs"
        self.host = f"127.0.0.1:{free_port()}"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> LocalRegistry:
        self.cert_dir.mkdir(parents=True)
        key, cert = self.folder / "key.pem", self.folder / "cert.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
            + ["-addext", ",".join(["subjectAltName=IP:127.0.0.1", *(f"DNS:{name}" for name in self.names)])]
            + ["-keyout", str(key), "-out", str(cert)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        shutil.copy(cert, self.cert_dir / "ca.crt")
        config = self.folder / "config.yml"
        config.write_text(
            f"version: 0.1\nlog: {{level: warn}}\nstorage: {{filesystem: {{rootdirectory: {self.storage}}}}}\n"
            f"http: {{addr: {self.host}, tls: {{certificate: {cert}, key: {key}}}}}\n"
        )
        log = (self.folder / "registry.log").open("w")
        self.process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        context = ssl.create_default_context(cafile=str(cert))
        while True:
            try:
                with urllib.request.urlopen(f"https://{self.host}/v2/", context=context, timeout=5) as answer:
                    if answer.status == 200:
                        return self
            except OSError as error:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.__exit__(None, None, None)
                    log_text = (self.folder / "registry.log").read_text()
                    raise AssertionError(f"docker-registry did not answer ({error}): {log_text}") from None
                time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def manifest(self, repository: str, digest: str) -> bytes:
        """The manifest the registry stored under `digest` for `repository`, read from its storage folder."""
        algorithm, hex_digest = digest.split(":")
        v2 = self.storage / "docker" / "registry" / "v2"
        link = v2 / "repositories" / repository / "_manifests" / "revisions" / algorithm / hex_digest / "link"
        assert link.read_text() == digest, f"{repository}@{digest} is not in the registry"
        return (v2 / "blobs" / algorithm / hex_digest[:2] / hex_digest / "data").read_bytes()
