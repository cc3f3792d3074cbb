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
sessions in other worktrees never remove an image this one is running.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

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
