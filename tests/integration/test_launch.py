"""`imagenet-train launch`: each launcher's environment becomes the right torchrun arguments; the documented main
job (`launch` with torchrun's rendezvous) exits 143 when stopped by SIGTERM, where plain torchrun exits 1."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.launchers.launch import command, resolve
from imagenet_train.ops.serve import free_port

from conftest import CHECKPOINTING_TRAIN, LONG_EPOCH, REPO, cli


@pytest.mark.unit
def test_plain_machine_is_a_standalone_single_node_run():
    launch = resolve({}, nproc="2")
    assert launch.kind == "standalone"
    assert launch.torchrun == ["--standalone", "--nnodes=1", "--nproc_per_node=2"]


def test_a_deployment_file_naming_a_kind_the_chart_cannot_deploy_is_refused_in_one_line(tmp_path):
    values = yaml.safe_load((REPO / "helm" / "imagenet-train" / "values.yaml").read_text())
    document = {key: values[key] for key in ("launcher", "shards", "results", "cache", "gcp", "resources")}
    document |= {"name": "r-imagenet-train", "release": "r"}
    document["launcher"]["kind"] = "slurm"  # a launcher kind, but not one the chart deploys
    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(document))
    result = cli("launch", "--dry-run", "--deployment", str(path), "--", "train")
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert f"--deployment {path}: launcher.kind: expected one of " in result.stderr
    assert all(kind in result.stderr for kind in ("pytorchjob", "indexedjob", "trainjob", "jobset", "got 'slurm'"))


@pytest.mark.unit
def test_pytorchjob_static_uses_the_operator_master_and_node_rank():
    env = {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "8",
        "PET_NODE_RANK": "1",
        "MASTER_ADDR": "r50-master-0",
        "MASTER_PORT": "23456",
        "WORLD_SIZE": "2",
        "RANK": "1",
    }
    assert resolve(env).torchrun == [
        "--nnodes=2",
        "--node_rank=1",
        "--nproc_per_node=8",
        "--master_addr=r50-master-0",
        "--master_port=23456",
    ]


@pytest.mark.unit
def test_pytorchjob_elastic_uses_rendezvous_and_node_range():
    env = {
        "PET_NNODES": "2:4",
        "PET_NPROC_PER_NODE": "8",
        "PET_RDZV_ENDPOINT": "r50-master-0:23456",
        "PET_RDZV_BACKEND": "c10d",
        "PET_MAX_RESTARTS": "3",
        "JOB_NAME": "r50",
        "MASTER_ADDR": "x",
    }
    launch = resolve(env)
    assert launch.label == "pytorchjob (elastic)"
    assert launch.torchrun == [
        "--nnodes=2:4",
        "--nproc_per_node=8",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=r50-master-0:23456",
        "--rdzv_id=r50",
        "--max_restarts=3",
    ]
    # A replaced node can rejoin: each rendezvous round publishes its own store (pytorch/pytorch#135712).
    assert launch.env == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert resolve({k: v for k, v in env.items() if not k.startswith("PET_RDZV")}).env == {}


@pytest.mark.unit
def test_trainjob_sets_pet_master_variables():
    env = {
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "4",
        "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": "tj-node-0-0.tj",
        "PET_MASTER_PORT": "29400",
    }
    launch = resolve(env)
    assert launch.kind == "trainjob"
    assert launch.torchrun == [
        "--nnodes=3",
        "--node_rank=2",
        "--nproc_per_node=4",
        "--master_addr=tj-node-0-0.tj",
        "--master_port=29400",
    ]


@pytest.mark.unit
def test_jobset_derives_pod_zero_hostname():
    env = {
        "JOBSET_NAME": "r50",
        "REPLICATED_JOB_NAME": "node",
        "JOB_COMPLETION_INDEX": "1",
        "NNODES": "2",
        "NPROC_PER_NODE": "8",
    }
    launch = resolve(env)
    assert launch.kind == "jobset"
    assert "--master_addr=r50-node-0-0.r50" in launch.torchrun and "--node_rank=1" in launch.torchrun


@pytest.mark.unit
def test_indexed_job_and_ngc():
    indexed = resolve({"JOB_COMPLETION_INDEX": "0", "NNODES": "4", "MASTER_ADDR": "r50-0.r50", "NPROC_PER_NODE": "8"})
    assert indexed.torchrun[:3] == ["--nnodes=4", "--node_rank=0", "--nproc_per_node=8"]
    single = resolve({"NGC_ARRAY_SIZE": "1", "NGC_GPUS_PER_NODE": "8"})
    assert single.torchrun == [
        "--nnodes=1",
        "--node_rank=0",
        "--nproc_per_node=8",
        "--master_addr=localhost",
        "--master_port=29500",
    ]
    replica = resolve(
        {"NGC_ARRAY_SIZE": "4", "NGC_REPLICA_ID": "3", "NGC_GPUS_PER_NODE": "8", "NGC_MASTER_ADDR": "launcher"}
    )
    assert "--node_rank=3" in replica.torchrun


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"JOB_COMPLETION_INDEX": "0", "NNODES": "2"}, "without MASTER_ADDR"),
        ({"NGC_ARRAY_SIZE": "2", "NGC_GPUS_PER_NODE": "8"}, "without NGC_MASTER_ADDR"),
        ({"NGC_ARRAY_SIZE": "two", "NGC_GPUS_PER_NODE": "8", "NGC_MASTER_ADDR": "a"}, "NGC_ARRAY_SIZE='two'"),
    ],
)
@pytest.mark.unit
def test_incomplete_environments_are_one_line_errors(env, message):
    with pytest.raises(ImagenetTrainError, match=message):
        resolve(env)


@pytest.mark.unit
def test_command_runs_the_cli_module_under_torchrun():
    argv = command(resolve({}, nproc="1"), ["train", "--epochs", "1"])
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert argv[-5:] == ["-m", "imagenet_train.cli", "train", "--epochs", "1"]


def test_launch_dry_run_prints_the_chosen_command():
    result = cli("launch", "--dry-run", "--nproc-per-node", "2", "--", "train", "--epochs", "3")
    assert result.returncode == 0
    assert "standalone: torchrun --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2 " in result.stdout
    tail = "--shutdown-timeout=80 --standalone --nnodes=1 --nproc_per_node=2 -m imagenet_train.cli train --epochs 3"
    assert tail in result.stdout


def main_job(page: Path) -> list[str]:
    """The training command of a page's "main job on real ImageNet" block (continuation lines joined)."""
    block = page.read_text().split("## The main job on real ImageNet", 1)[1].split("```bash", 1)[1].split("```")[0]
    joined = re.sub(r"\\\n\s*", " ", block)
    line = next(line for line in joined.splitlines() if " train " in line and "--run-dir" in line)
    return shlex.split(line.split("#")[0])


def test_readme_and_getting_started_name_the_same_main_job_and_it_is_launch():
    readme, guide = main_job(REPO / "README.md"), main_job(REPO / "docs" / "getting-started.md")
    assert readme == guide
    assert readme[:2] == ["imagenet-train", "launch"], readme  # plain torchrun exits 1 on SIGTERM


def test_the_documented_main_job_is_torchruns_rendezvous_on_each_node():
    job = [word.replace("$HEAD", "head-0") for word in main_job(REPO / "README.md")]
    result = cli(*job[1:2], "--dry-run", *job[2:])
    assert result.returncode == 0, result.stderr
    expected = "--nnodes=4 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=head-0:29500 --rdzv_id=imagenet-train"
    assert "rendezvous: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --signals-to-handle=" in result.stdout
    assert (
        expected in result.stdout and "-m imagenet_train.cli train --config recipes/rn50-ffcv-88.yaml" in result.stdout
    )


def test_nnodes_without_a_rendezvous_is_one_line():
    result = cli("launch", "--nnodes", "4", "--dry-run", "--", "train")
    assert result.returncode == 2 and result.stderr.strip() == (
        "imagenet-train: error: --nnodes 4: needs --rdzv-endpoint HOST:PORT (the first node's)"
    ), result.stderr


def stopped_mid_epoch(job: list[str], run_dir: Path, digit_shards: Path) -> tuple[int, str]:
    """`job ... train` on 2 gloo ranks, sent SIGTERM once a mid-epoch checkpoint exists; exit code and output."""
    args = [*CHECKPOINTING_TRAIN, *LONG_EPOCH, "--shards", str(digit_shards), "--run-dir", str(run_dir)]
    process = subprocess.Popen(
        [*job, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    deadline = time.monotonic() + 400
    while not list(run_dir.glob("checkpoints/epoch-0000-step-*.pt")) and time.monotonic() < deadline:
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)  # to the launcher only, as a scheduler pre-empting the job sends it
    try:
        output, _ = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"no exit within 300 s of SIGTERM:\n{output[-4000:]}")
    return process.returncode, output


STOPPED = re.compile(r"stopped by SIGTERM at epoch 0 step (\d+): checkpoint (\S+); continue with --resume latest")


@pytest.mark.slow
def test_the_documented_main_job_stopped_by_sigterm_exits_143_with_its_checkpoint(digit_shards, tmp_path):
    """README's main job on one node of 2 gloo ranks: SIGTERM mid-epoch, a checkpoint, and 143 for the scheduler."""
    executable = str(Path(sys.executable).with_name("imagenet-train"))
    endpoint = f"127.0.0.1:{free_port()}"
    job = [executable, "launch", "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-endpoint", endpoint, "train"]
    code, output = stopped_mid_epoch(job, tmp_path / "run", digit_shards)
    stopped = STOPPED.search(output)
    assert code == 143, output[-4000:]
    assert stopped and Path(stopped.group(2)).exists(), output[-4000:]
    assert "Traceback" not in output, output[-4000:]


@pytest.mark.slow
def test_plain_torchrun_stopped_by_sigterm_exits_1_after_the_checkpoint(digit_shards, tmp_path):
    """What docs/faults.md says of plain torchrun, measured: the ranks stop cleanly, the agent still exits 1."""
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    code, output = stopped_mid_epoch([*job, "-m", "imagenet_train.cli", "train"], tmp_path / "run", digit_shards)
    stopped = STOPPED.search(output)
    assert stopped and Path(stopped.group(2)).exists(), output[-4000:]
    assert code == 1 and "SignalException" in output, (code, output[-4000:])
