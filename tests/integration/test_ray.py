"""`imagenet-train ray` against a real local Ray cluster: 2 workers train the digits from nginx, and a worker
killed mid-run is restarted from the newest checkpoint. The cluster test is slow (minutes on 2 cores):
`make launchers` runs it; `make test` runs the fast checks here."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import SMALL_TRAIN, cli, read_metrics

RAY = str(Path(sys.executable).with_name("ray"))
IMAGENET_TRAIN = str(Path(sys.executable).with_name("imagenet-train"))


@dataclass(frozen=True)
class RayCluster:
    address: str
    env: dict[str, str]
    temp_dir: str

    def processes(self, title: str = "") -> list[int]:
        """Pids of this cluster's processes: those naming its temp dir or address, and their descendants."""
        parents, cmdlines = {}, {}
        for entry in Path("/proc").iterdir():
            try:
                pid = int(entry.name)
                cmdlines[pid] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                parents[pid] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
        ours = {pid for pid, line in cmdlines.items() if self.temp_dir in line or f"--address={self.address}" in line}
        grew = True
        while grew:
            children = {pid for pid, parent in parents.items() if parent in ours} - ours
            ours |= children
            grew = bool(children)
        return sorted(pid for pid in ours if cmdlines[pid].startswith(title))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def ray_cluster() -> Iterator[RayCluster]:
    """`ray start --head` on 127.0.0.1 with 2 CPUs and its own temp dir; its processes are killed afterwards."""
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # every address Ray picks is then 127.0.0.1
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("RAY_ADDRESS", None)
    cluster = RayCluster(f"127.0.0.1:{port}", env, temp)
    try:
        subprocess.run(
            [RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
             "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats",
             "--object-store-memory=100000000", f"--ray-client-server-port={free_port()}"],
            env=env, check=True, capture_output=True, timeout=180,
        )  # fmt: skip
        yield cluster
    finally:
        for pid in cluster.processes():  # `ray stop` would stop every Ray on the machine, not just this one
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


def wait_for(path_glob: Path, process: subprocess.Popen, timeout: float) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(path_glob.parent.glob(path_glob.name))
        if found:
            return found[0]
        if process.poll() is not None:
            pytest.fail(f"the Ray run ended before {path_glob.name} was written:\n{process.stdout.read()[-5000:]}")
        time.sleep(0.5)
    pytest.fail(f"no {path_glob} within {timeout}s")


@pytest.mark.launchers
@pytest.mark.timeout(900)
def test_ray_workers_train_the_digits_and_a_killed_worker_resumes_from_the_latest_checkpoint(
    ray_cluster, shard_server, tmp_path
):
    run_dir = tmp_path / "run"
    command = [
        IMAGENET_TRAIN,
        "ray",
        "--address",
        ray_cluster.address,
        "--workers",
        "2",
        "--max-failures",
        "2",
        "--",
        "train",
        "--shards",
        f"{shard_server.url}/shards.json",
        "--run-dir",
        str(run_dir),
        "--epochs",
        "3",
        "--epoch-batches",
        "12",
        "--checkpoint-every",
        "4",
        *SMALL_TRAIN,
        "--workers",
        "1",
        "--lr",
        "0.4",
        "--label-smoothing",
        "0",
        "--min-crop-scale",
        "0.5",
        "--warmup-epochs",
        "0.5",
    ]  # fmt: skip (0.5 epochs: the 12 steps warmup took when it counted intervals)
    process = subprocess.Popen(
        command, env=ray_cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for(run_dir / "checkpoints" / "epoch-0001-step-*.pt", process, timeout=600)
        workers = ray_cluster.processes("ray::RayTrainWorker")
        assert len(workers) == 2, workers
        os.kill(max(workers), signal.SIGKILL)
        output, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output[-5000:]
    assert "resumed from" in output and "continuing at epoch 1, step " in output, output[-5000:]
    metrics = read_metrics(run_dir)
    assert [m["epoch"] for m in metrics] == [0, 1, 2]
    resumed = metrics[1]["resumed_from_step"]
    assert resumed in (4, 8)  # the newest mid-epoch checkpoint when the worker died
    # No batch lost or repeated: the resumed part trains exactly what the epoch still owed, on both ranks.
    assert metrics[1]["batches_per_rank"] == [12 - resumed] * 2
    assert all(m["replicas_in_sync"] for m in metrics)
    print(f"ray: top-1 {metrics[-1]['top1']:.4f} after {len(metrics)} epochs of 12 steps; resumed at step {resumed}")
    assert metrics[-1]["top1"] > 0.3  # 10 classes: chance is 0.1 (36 steps reach about 0.45)


def test_ray_command_needs_the_training_command(tmp_path):
    result = cli("ray", "--workers", "2", "--", "plan", "--shards", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "imagenet-train: error: ray: expected the training command after the options, "
        "e.g. `imagenet-train ray --workers 2 -- train --shards URL`"
    )


def test_ray_world_size_is_one_worker_per_gpu_unless_told():
    from imagenet_train.errors import ImagenetTrainError
    from imagenet_train.launchers.ray_train import RayTrainOptions, world_size

    assert world_size(RayTrainOptions(), cluster_gpus=8) == (8, True)
    assert world_size(RayTrainOptions(workers=2), cluster_gpus=8) == (2, True)
    assert world_size(RayTrainOptions(workers=2), cluster_gpus=0) == (2, False)
    with pytest.raises(ImagenetTrainError, match="give --workers N"):
        world_size(RayTrainOptions(), cluster_gpus=0)
    with pytest.raises(ImagenetTrainError, match="reports no GPUs"):
        world_size(RayTrainOptions(workers=2, gpus=True), cluster_gpus=0)


def test_a_process_group_set_up_by_the_launcher_is_used_and_left_open(tmp_path, monkeypatch):
    import torch.distributed as dist

    from imagenet_train.training.dist import cleanup, init_distributed

    for name in ("RANK", "WORLD_SIZE"):  # Ray Train describes the group by the group itself
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_RANK", "0")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        info = init_distributed()
        assert (info.rank, info.world, info.local_rank) == (0, 1, 0)
        cleanup()
        assert dist.is_initialized()  # the launcher's group is the launcher's to close
    finally:
        dist.destroy_process_group()
