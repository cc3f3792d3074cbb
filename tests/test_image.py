"""The training image, built for real with podman from images/train/Dockerfile and run.

No registry can be pulled from here, so the CUDA PyTorch base is replaced by a stand-in: Debian
bookworm from mmdebstrap with CPU torch (the local wheel) and torchvision, passed as BASE_IMAGE.
The stand-in bases are cached as images between runs; the image under test is removed afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imagenet_train.ops.serve import NginxServer

from conftest import REPO, SMALL_TRAIN, read_metrics

STAGE0 = "localhost/imagenet-train-stage0:bookworm"
TESTBASE = "localhost/imagenet-train-testbase:torch2.13.0-nvidia-entrypoint"
IMAGE = "localhost/imagenet-train:image-test"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""

SIGNAL_OPTIONS = "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2 --shutdown-timeout=80"

pytestmark = pytest.mark.timeout(1500)


def _torch_wheel() -> Path | None:
    for folder in [*os.environ.get("PIP_FIND_LINKS", "").split(), "/opt/wheels"]:
        found = sorted(Path(folder).glob("torch-2.13.0+cpu-cp311-*.whl")) if Path(folder).is_dir() else []
        if found:
            return found[0]
    return None


class Podman:
    def __init__(self, config_dir: Path):
        (config_dir / "containers.conf").write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(config_dir / "containers.conf")}

    def __call__(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        result = subprocess.run(["podman", *args], capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"podman {' '.join(args[:3])} failed ({result.returncode}):\n{result.stderr[-4000:]}")
        return result

    def exists(self, image: str) -> bool:
        return self("image", "exists", image, check=False).returncode == 0


def _build_context(tmp: Path) -> Path:
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


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    if not shutil.which("podman") or not shutil.which("mmdebstrap"):
        pytest.skip("podman/mmdebstrap not installed (make image-deps installs them as root)")
    wheel = _torch_wheel()
    if wheel is None:
        pytest.skip("no local CPU torch 2.13.0 wheel to build the stand-in base image from")
    tmp = tmp_path_factory.mktemp("image")
    engine = Podman(tmp)
    if not engine.exists(STAGE0):
        rootfs = tmp / "rootfs.tar"
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=minbase",
                "--include=python3,python3-venv,ca-certificates",
                "bookworm",
                str(rootfs),
            ],
            check=True,
            timeout=600,
        )
        engine("import", str(rootfs), STAGE0)
        rootfs.unlink()
    if not engine.exists(TESTBASE):
        engine(
            "build",
            "--pull=never",
            "--network=host",
            "-f",
            str(REPO / "tests/image/Containerfile.testbase"),
            "-v",
            f"{wheel.parent}:/wheels:ro",
            "-v",
            f"{CA_BUNDLE}:{CA_BUNDLE}:ro",
            "-t",
            TESTBASE,
            str(REPO / "tests/image"),
        )
    revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    # The documented release path, `make build`, with the flags this machine needs.
    flags = f"--pull=never --network=host -v {CA_BUNDLE}:{CA_BUNDLE}:ro"
    built = subprocess.run(
        [
            "make",
            "-C",
            str(_build_context(tmp)),
            "build",
            "CONTAINER=podman",
            f"BASE_IMAGE={TESTBASE}",
            "IMAGE=localhost/imagenet-train",
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
    engine.revision = revision
    yield engine
    engine("rmi", "--force", IMAGE, check=False)
    engine("image", "prune", "--force", "--filter", "label=org.imagenet-train.stage=builder", check=False)


def run(podman: Podman, *args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    flags = [item for key, value in (env or {}).items() for item in ("-e", f"{key}={value}")]
    return podman("run", "--rm", "--network=host", *flags, *args, **kw)


def test_image_help_runs_as_non_root(podman):
    result = run(podman, IMAGE, "--help")
    assert "usage: imagenet-train" in result.stdout
    assert run(podman, "--entrypoint", "id", IMAGE, "-u").stdout.strip() == "10001"


def test_nvidia_entrypoint_runs_first_then_imagenet_train(podman):
    entrypoint = podman("image", "inspect", IMAGE, "--format", "{{json .Config.Entrypoint}}").stdout
    assert json.loads(entrypoint) == ["/usr/local/bin/imagenet-train-entrypoint"]
    result = run(podman, IMAGE, "--help", check=False)
    assert "nvidia_entrypoint.sh (stand-in): CUDA forward compatibility checked" in result.stderr
    assert result.returncode == 0 and "usage: imagenet-train" in result.stdout, result.stdout


def test_image_runs_the_chart_probe_under_the_charts_restricted_security_context(podman, shard_server):
    """The chart's pods: uid 10001, read-only root, /tmp the only writable path, no capabilities."""
    restricted = [
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--user",
        "10001:10001",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
    ]
    probe = run(podman, *restricted, IMAGE, "probe", f"{shard_server.url}/shards.json", check=False)
    assert probe.returncode == 0, probe.stderr
    assert "1438 train samples in 12 shards" in probe.stdout
    gcs = run(
        podman,
        *restricted,
        "--entrypoint",
        "python3",
        IMAGE,
        "-c",
        "import google.cloud.storage, imagenet_train.io.gcs, boto3\n"
        "from imagenet_train.loading.jpegcrop import available\n"
        "print('gcs ok' if available() else 'no libturbojpeg')",
        check=False,
    )
    assert gcs.stdout.strip() == "gcs ok", gcs.stderr


def test_image_labels_and_no_secrets_in_any_layer(podman):
    labels = json.loads(podman("image", "inspect", IMAGE).stdout)[0]["Labels"]
    assert labels["org.opencontainers.image.version"] == "image-test"
    assert labels["org.opencontainers.image.revision"] == podman.revision
    assert labels["org.opencontainers.image.title"] == "imagenet-train"
    history = podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", IMAGE).stdout
    assert "google-key" not in history and "private_key" not in history
    found = run(
        podman,
        "--entrypoint",
        "sh",
        IMAGE,
        "-c",
        "grep -rl planted-secret-7f3a9c /usr /opt /home /workspace /tmp 2>/dev/null; find / -xdev -name 'google-key*'"
        " -o -xdev -name metrics.jsonl 2>/dev/null",
        check=False,
    ).stdout
    assert found.strip() == ""


def test_base_torch_is_kept_not_upgraded(podman):
    script = (
        "from imagenet_train.compat import ensure_torchvision; ensure_torchvision(); "
        "import torch, torchvision, webdataset; print(torch.__version__, torchvision.__version__)"
    )
    versions = run(podman, "--entrypoint", "python3", IMAGE, "-c", script).stdout.split()
    assert versions == ["2.13.0+cpu", "0.28.0+cu130"]  # exactly what the stand-in base carries


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "standalone: torchrun --standalone --nnodes=1 --nproc_per_node=1"),
        (
            {
                "PET_NNODES": "4",
                "PET_NPROC_PER_NODE": "8",
                "PET_NODE_RANK": "2",
                "MASTER_ADDR": "job-master-0",
                "MASTER_PORT": "23456",
                "WORLD_SIZE": "4",
                "RANK": "2",
            },
            "pytorchjob: torchrun --nnodes=4 --node_rank=2 --nproc_per_node=8 --master_addr=job-master-0 "
            "--master_port=23456",
        ),
        (
            {"NGC_ARRAY_SIZE": "2", "NGC_ARRAY_INDEX": "1", "NGC_GPUS_PER_NODE": "8", "NGC_MASTER_ADDR": "ngc-0"},
            "ngc: torchrun --nnodes=2 --node_rank=1 --nproc_per_node=8 --master_addr=ngc-0",
        ),
        (
            {"JOB_COMPLETION_INDEX": "3", "NNODES": "4", "NPROC_PER_NODE": "8", "MASTER_ADDR": "it-0.it"},
            "indexedjob: torchrun --nnodes=4 --node_rank=3 --nproc_per_node=8 --master_addr=it-0.it",
        ),
    ],
)
def test_entrypoint_maps_each_launcher_environment_to_torchrun(podman, env, expected):
    result = run(podman, IMAGE, "launch", "--dry-run", "--", "train", "--epochs", "1", env=env)
    launcher, _, torchrun = expected.partition(": torchrun ")
    # Signal forwarding and the grace period come first, then the launcher's own options.
    assert f"{launcher}: torchrun {SIGNAL_OPTIONS} {torchrun}" in result.stdout
    assert result.stdout.strip().endswith("-m imagenet_train.cli train --epochs 1")


def test_two_process_training_in_the_container_reads_host_nginx_and_writes_results(podman, digit_shards, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    results.chmod(0o777)  # the container's non-root user writes here
    conf = (REPO / "images/shard-server/nginx.conf").read_text()
    with NginxServer(str(digit_shards)) as server:
        config = (server.state / "nginx.conf").read_text().splitlines()
        included = [line.split()[1].rstrip(";") for line in config if line.strip().startswith("include ")]
        assert [Path(path).read_text() for path in included] == [conf]  # the shipped config, unchanged
        result = run(
            podman,
            "--shm-size=1g",
            "-v",
            f"{results}:/results",
            IMAGE,
            "launch",
            "--nproc-per-node",
            "2",
            "--",
            "train",
            "--shards",
            f"{server.url}/shards.json",
            "--run-dir",
            "/results/run",
            "--epochs",
            "1",
            "--epoch-batches",
            "4",
            *SMALL_TRAIN,
            "--batch-size",
            "16",
            "--workers",
            "1",
            check=False,
            timeout=600,
        )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    assert f"launch: standalone: torchrun {SIGNAL_OPTIONS} --standalone --nnodes=1 --nproc_per_node=2" in result.stdout
    metrics = read_metrics(results / "run")
    assert metrics[0]["batches_per_rank"] == [4, 4] and metrics[0]["val_samples"] == 359
    assert (results / "run" / "checkpoints" / "epoch-0000.pt").exists()


def test_dockerfile_passes_hadolint():
    hadolint = Path(sys.executable).with_name("hadolint")
    result = subprocess.run([str(hadolint), str(REPO / "images/train/Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
