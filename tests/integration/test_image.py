"""The training image, built for real with podman from images/train/Dockerfile and run.

No registry can be pulled from here, so the CUDA PyTorch base is replaced by a stand-in: Debian
bookworm from mmdebstrap with CPU torch (the local wheel) and torchvision, passed as BASE_IMAGE
(tests/imagebuild.py, shared with tests/e2e). The stand-in bases are cached as images between runs; the
image under test is removed at the end of the session. `make push` sends it to Debian's docker-registry on
127.0.0.1, and it is pulled back by digest into an empty image store and run.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from imagebuild import IMAGE, LocalRegistry, Podman, registry_missing

from imagenet_train.ops.serve import NginxServer

from .test_trackers import item_values, tracker_id, wandb_records
from conftest import REPO, SMALL_TRAIN, read_metrics

SIGNAL_OPTIONS = "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2 --shutdown-timeout=80"

pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def podman(training_image) -> Podman:
    """The engine that built the image under test (tests/imagebuild.py: `make build` on the stand-in base)."""
    return training_image.engine


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
        "from imagenet_train.loading.fused_decoder import available\n"
        "print('gcs ok' if available() else 'no libturbojpeg')",
        check=False,
    )
    assert gcs.stdout.strip() == "gcs ok", gcs.stderr


def test_image_labels_and_no_secrets_in_any_layer(podman, training_image):
    labels = json.loads(podman("image", "inspect", IMAGE).stdout)[0]["Labels"]
    assert labels["org.opencontainers.image.version"] == "image-test"
    assert labels["org.opencontainers.image.revision"] == training_image.revision
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


# A shell line a `pipe:` shard runs: the subshell ends at once and leaves its `sleep` to the container's pid 1.
ORPHAN = "(sleep 0.1 &); "
# Then, before the val shard's bytes: what runs as pid 1, and how many zombies wait for it to reap them.
ZOMBIES = (
    """sleep 2; echo "pid 1: $(cat /proc/1/comm); zombies: $(cat /proc/[0-9]*/stat | awk '$3 == "Z"' | wc -l)" >&2; """
)


def test_one_process_training_started_bare_in_the_container_has_tini_reap_what_pipe_commands_leave(
    podman, digit_shards, tmp_path
):
    """`docker run IMAGE train ...` without `launch`: one rank, with loader workers, under tini as the container's
    pid 1. Its `pipe:` shard commands leave orphans; tini reaps them, where a rank as pid 1 would keep zombies."""
    results, shards = tmp_path / "results", shutil.copytree(digit_shards, tmp_path / "shards")
    results.mkdir()
    results.chmod(0o777)  # the container's non-root user writes here, and reads the shards
    shards.chmod(0o755)
    mounts = ["-v", f"{shards}:/shards:ro", "-v", f"{results}:/results"]
    train_urls = "::".join(f"pipe:{ORPHAN}cat /shards/{tar.name}" for tar in sorted(shards.glob("*train-*.tar")))
    val_urls = "::".join(f"pipe:{ZOMBIES}cat /shards/{tar.name}" for tar in sorted(shards.glob("*val-*.tar")))
    train = ["train", "--train-urls", train_urls, "--val-urls", val_urls, "--num-classes", "10"]
    train += ["--train-samples", "1438", "--run-dir", "/results/run", "--epochs", "1", "--epoch-batches", "4"]
    options = [*SMALL_TRAIN, "--batch-size", "16", "--workers", "1"]
    result = run(podman, "--shm-size=1g", *mounts, IMAGE, *train, *options, check=False, timeout=600)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    metrics = read_metrics(results / "run")
    assert metrics[0]["batches_per_rank"] == [4] and metrics[0]["val_samples"] == 359
    seen = re.findall(r"pid 1: (\S+); zombies: (\d+)", result.stderr)
    assert seen and all(pid1 == "tini" and zombies == "0" for pid1, zombies in seen), result.stderr[-4000:]


def make_push(podman: Podman, registry: LocalRegistry, digest_file: Path) -> subprocess.CompletedProcess:
    """`make push` of REGISTRY/imagenet-train:image-test, trusting the registry's CA by its cert dir."""
    variables = [f"REGISTRY={registry.host}", "IMAGE=imagenet-train", "TAG=image-test", "CONTAINER=podman"]
    variables += [f"REGISTRY_CERT_DIR={registry.cert_dir}", f"DIGEST_FILE={digest_file}"]
    command = ["make", "--no-print-directory", "-C", str(REPO), "push", *variables]
    return subprocess.run(command, env=podman.env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_make_push_sends_the_image_to_a_registry_and_a_pull_by_its_digest_runs_it(podman, training_image, tmp_path):
    """Debian's docker-registry on 127.0.0.1 over TLS: `make push`, the local tag removed, the image pulled back by
    the printed digest into an empty image store (every layer from the registry) and `imagenet-train --help` run."""
    reason = registry_missing()
    if reason:
        pytest.skip(reason)
    with LocalRegistry(tmp_path / "registry") as registry:
        pushed = f"{registry.host}/imagenet-train"
        podman("tag", IMAGE, f"{pushed}:image-test")
        push = make_push(podman, registry, tmp_path / "digest")
        podman("rmi", f"{pushed}:image-test")  # the image under test keeps its own name
        assert push.returncode == 0, push.stdout[-2000:] + push.stderr[-4000:]
        assert not podman.exists(f"{pushed}:image-test")
        digest = (tmp_path / "digest").read_text().strip()
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
        assert f"pushed {pushed}@{digest}\n" in push.stdout
        assert f"--set image.repository={pushed} --set image.digest={digest}" in push.stdout
        # The registry stored a manifest whose bytes hash to the digest, naming the image's own config.
        manifest = registry.manifest("imagenet-train", digest)
        assert f"sha256:{hashlib.sha256(manifest).hexdigest()}" == digest
        image_id = podman("image", "inspect", IMAGE, "--format", "{{.Id}}").stdout.strip()
        assert json.loads(manifest)["config"]["digest"] == f"sha256:{image_id}"

        # podman refuses a runroot path over 50 characters: a short one under /tmp, removed below.
        runroot = tempfile.mkdtemp(prefix="podman-run-", dir="/tmp")
        store = ["--root", str(tmp_path / "store"), "--runroot", runroot]
        by_digest = f"{pushed}@{digest}"
        try:
            untrusted = podman(*store, "pull", by_digest, check=False)  # TLS is verified, not waved through
            assert untrusted.returncode != 0 and "x509: certificate signed by unknown authority" in untrusted.stderr
            podman(*store, "pull", "--cert-dir", str(registry.cert_dir), by_digest)
            pulled = json.loads(podman(*store, "image", "inspect", by_digest).stdout)[0]
            assert pulled["Id"] == image_id and by_digest in pulled["RepoDigests"]
            assert pulled["Labels"]["org.opencontainers.image.revision"] == training_image.revision
            result = podman(*store, "run", "--rm", "--network=host", by_digest, "--help")
            assert "usage: imagenet-train" in result.stdout and "ImageNet to WebDataset shards" in result.stdout
        finally:
            podman(*store, "rmi", "--all", "--force", check=False)
            shutil.rmtree(runroot, ignore_errors=True)
    assert registry.process.poll() is not None  # stopped by its PID
    shutil.rmtree(registry.storage)  # the image's compressed layers: hundreds of MB per kept basetemp


def test_make_push_without_a_registry_says_so_in_one_line():
    result = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), "push", "REGISTRY=", "CONTAINER=podman"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("make push: REGISTRY is empty; expected e.g. REGISTRY=ghcr.io/acme\n")


def test_dockerfile_passes_hadolint():
    hadolint = Path(sys.executable).with_name("hadolint")
    result = subprocess.run([str(hadolint), str(REPO / "images/train/Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_carries_both_tracker_clients_at_their_pins(podman):
    """--tracker mlflow|wandb works in a pod: both libraries import (images/train/requirements.txt)."""
    script = "import mlflow, wandb; from importlib.metadata import version as v; print(v('mlflow-skinny'), v('wandb'))"
    imported = run(podman, "--entrypoint", "python3", IMAGE, "-c", script)
    assert imported.stdout.split() == ["3.17.2", "0.31.0"]  # the pyproject extras' pins


@pytest.mark.slow  # a training run in the container (~30 s of CPU); `make image-test` runs it
def test_wandb_offline_run_of_a_training_run_in_the_container_records_its_epochs(podman, digit_shards, tmp_path):
    """`--tracker wandb` in the image gets past the library check and W&B's offline files hold the epoch."""
    results = tmp_path / "results"
    results.mkdir()
    results.chmod(0o777)  # the container's non-root user writes here
    result = run(
        podman,
        "--shm-size=1g",
        "-v",
        f"{digit_shards}:/shards:ro",
        "-v",
        f"{results}:/results",
        IMAGE,
        "launch",  # the pods' path: torchrun starts the rank, as in every launcher
        "--nproc-per-node",
        "1",
        "--",
        "train",
        "--shards",
        "/shards",
        "--run-dir",
        "/results/run",
        "--epochs",
        "1",
        "--epoch-batches",
        "2",
        *SMALL_TRAIN,
        "--workers",
        "1",
        "--tracker",
        "wandb",
        env={"WANDB_MODE": "offline", "WANDB_PROJECT": "digits"},
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    run_dir = results / "run"
    run_id = tracker_id(run_dir)
    folders = list((run_dir / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(folders) == 1, sorted(path.name for path in (run_dir / "wandb").iterdir())
    history = [
        item_values(record.history.item)
        for record in wandb_records(folders[0] / f"run-{run_id}.wandb")
        if record.WhichOneof("record_type") == "history"
    ]
    lines = read_metrics(run_dir)
    assert [values["epoch"] for values in history] == [line["epoch"] for line in lines] == [0]
    assert history[0]["train_loss"] == pytest.approx(lines[0]["train_loss"])
