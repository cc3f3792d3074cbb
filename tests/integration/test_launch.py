"""`imagenet-train launch`: each launcher's environment becomes the right torchrun arguments."""

import pytest

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.launchers.launch import command, resolve

from conftest import cli


@pytest.mark.unit
def test_plain_machine_is_a_standalone_single_node_run():
    launch = resolve({}, nproc="2")
    assert launch.launcher == "standalone"
    assert launch.torchrun == ["--standalone", "--nnodes=1", "--nproc_per_node=2"]


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
    assert launch.launcher == "pytorchjob (elastic)"
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
    assert launch.launcher == "trainjob"
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
    assert launch.launcher == "jobset"
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
