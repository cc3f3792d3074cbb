"""tools/ngc.py against a recording `ngc` on PATH: golden `ngc batch run` commands, state, tail, kill."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from imagenet_train.launchers.launch import resolve

from conftest import REPO as ROOT

FAKE_NGC = Path(__file__).with_name("ngc")
IMAGE = "nvcr.io/acme/imagenet-train:v1"
COMMON = {"image": {"repository": "nvcr.io/acme/imagenet-train", "tag": "v1"}}


def ngc_tool(tmp_path: Path, *args: str, values: dict | None = None, stdin: str = "", path: str | None = None):
    files = []
    if values is not None:
        file = tmp_path / "values.yaml"
        file.write_text(yaml.safe_dump({**COMMON, **values}))
        files = ["-f", str(file)]
    env = {
        **os.environ,
        "PATH": path if path is not None else f"{FAKE_NGC}:{os.environ['PATH']}",
        "NGC_RECORD": str(tmp_path / "record.jsonl"),
        "NGC_LIST": str(tmp_path / "list.json"),
    }
    command = [sys.executable, str(ROOT / "tools" / "ngc.py"), "--state", str(tmp_path / "state.json"), *args]
    if args and args[0] in ("submit", "kill"):
        command += files
    return subprocess.run(command, capture_output=True, text=True, env=env, input=stdin, timeout=60)


def recorded(tmp_path: Path) -> list[list[str]]:
    record = tmp_path / "record.jsonl"
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def dry_run(tmp_path: Path, values: dict, name: str = "r50") -> list[str]:
    result = ngc_tool(tmp_path, "submit", "--name", name, "--dry-run", values=values)
    assert result.returncode == 0, result.stderr
    return shlex.split(result.stdout)


def commandline(argv: list[str]) -> list[str]:
    return shlex.split(argv[argv.index("--commandline") + 1])


def test_single_node_job_reads_a_mounted_dataset(tmp_path):
    argv = dry_run(
        tmp_path,
        {
            "launcher": {"nodes": 1},
            "ngc": {
                "ace": "nv-us-west-2",
                "org": "acme",
                "team": "vision",
                "shards": "/mnt/imagenet/shards.json",
                "datasets": [{"id": 1234567, "mount": "/mnt/imagenet"}],
            },
        },
    )
    assert argv == [
        "ngc",
        "batch",
        "run",
        "--name",
        "r50",
        "--image",
        IMAGE,
        "--instance",
        "dgxa100.80g.8.norm",
        "--commandline",
        "imagenet-train launch --nproc-per-node 8 -- train --resume latest --preflight "
        "--shards /mnt/imagenet/shards.json --run-dir /results",
        "--result",
        "/results",
        "--total-runtime",
        "72H",
        "--preempt",
        "RUNONCE",
        "--ace",
        "nv-us-west-2",
        "--org",
        "acme",
        "--team",
        "vision",
        "--datasetid",
        "1234567:/mnt/imagenet",
        "--label",
        "imagenet-train",
        "--format_type",
        "json",
    ]


def test_multinode_job_is_a_pytorch_array_with_workspace_and_labels(tmp_path):
    argv = dry_run(
        tmp_path,
        {
            "launcher": {"nodes": 4},
            "train": {"global_batch_size": 4096, "epochs": 40},
            "ngc": {
                "instance": "dgxh100.80g.8.norm",
                "totalRuntime": "2D12H",
                "preempt": "RESUMABLE",
                "shards": "/mnt/imagenet/shards.json",
                "datasets": [{"id": 1234567, "mount": "/mnt/imagenet"}],
                "workspaces": [{"id": "acme-ckpt", "mount": "/ws", "mode": "RW"}],
                "labels": ["r50-sweep"],
            },
        },
        name="r50-4x8",
    )
    assert argv[argv.index("--instance") + 1] == "dgxh100.80g.8.norm"
    assert argv[argv.index("--array-type") :] == ["--array-type", "PYTORCH", "--replicas", "4", "--format_type", "json"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--label"] == ["imagenet-train", "r50-sweep"]
    assert argv[argv.index("--workspace") + 1] == "acme-ckpt:/ws:RW"
    assert argv[argv.index("--total-runtime") + 1] == "2D12H" and argv[argv.index("--preempt") + 1] == "RESUMABLE"
    program = commandline(argv)
    assert program[program.index("--global-batch-size") + 1] == "4096"  # each of 4 x 8 ranks takes 128
    assert program[program.index("--epochs") + 1] == "40"


def test_aistore_backed_job_waits_for_the_cluster_and_sets_its_endpoint(tmp_path):
    argv = dry_run(
        tmp_path,
        {
            "launcher": {"nodes": 2},
            "shards": {
                "server": "aistore",
                "aistore": {"endpoint": "http://ais.acme.internal:51080", "bucket": "inet"},
            },
        },
    )
    assert argv[argv.index("--env-var") + 1] == "AIS_ENDPOINT:http://ais.acme.internal:51080"
    assert commandline(argv)[:9] == [
        "imagenet-train",
        "launch",
        "--nproc-per-node",
        "8",
        "--wait-for",
        "ais://inet/shards.json",
        "--wait-timeout",
        "1800",
        "--",
    ]


def test_bucket_backed_job_streams_gs_and_sends_results_to_the_bucket(tmp_path):
    argv = dry_run(
        tmp_path,
        {
            "launcher": {"nodes": 2},
            "shards": {"server": "bucket", "bucket": {"url": "gs://acme-data/imagenet/shards/"}},
            "results": {"bucket": "gs://acme-runs/imagenet"},
            "ngc": {"gcpKeyFile": "/ws/keys/gcp.json", "workspaces": [{"id": "acme-keys", "mount": "/ws"}]},
        },
        name="r50-gs",
    )
    program = commandline(argv)
    assert program[program.index("--shards") + 1] == "gs://acme-data/imagenet/shards/shards.json"
    assert program[program.index("--results") + 1] == "gs://acme-runs/imagenet/r50-gs"
    assert "--wait-for" not in program
    assert argv[argv.index("--env-var") + 1] == "GOOGLE_APPLICATION_CREDENTIALS:/ws/keys/gcp.json"
    assert argv[argv.index("--workspace") + 1] == "acme-keys:/ws:RO"


DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "shards.server: nginx runs inside Kubernetes"),
        (
            {"resources": {"limits": {"nvidia.com/gpu": 4}}},
            "ngc.instance: dgxa100.80g.8.norm has 8 GPUs per node but resources.limits asks for nvidia.com/gpu: 4",
        ),
        ({"launcher": {"nodes": 3}, "train": {"global_batch_size": 1000}}, "train.global_batch_size: 1000 does not"),
        ({"ngc": {"preempt": "SOMETIMES"}}, "ngc.preempt"),
        ({"ngc": {"totalRuntime": "3 days"}}, "ngc.totalRuntime"),
        ({"ngc": {"instanse": "x"}}, "ngc.instanse: unknown key"),
        ({"shards": {"server": "aistore", "aistore": {"deploy": True}}}, "shards.aistore.endpoint: NGC jobs need"),
        (
            {"shards": {"server": "bucket", "bucket": {"url": "gs://acme-data/s"}}, "image": {"digest": DIGEST}},
            "image.digest: NGC batch jobs name their image by tag (--image REPOSITORY:TAG), so a digest cannot pin",
        ),
    ],
)
def test_bad_values_are_one_line_errors_before_ngc_is_called(tmp_path, values, message):
    result = ngc_tool(tmp_path, "submit", "--name", "x", values=values)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert message in result.stderr, result.stderr
    assert recorded(tmp_path) == []


def test_submit_records_the_job_and_tail_follows_the_last_one(tmp_path):
    values = {"shards": {"server": "bucket", "bucket": {"url": "gs://acme-data/s"}}}
    submitted = ngc_tool(tmp_path, "submit", "--name", "r50", values=values)
    assert submitted.returncode == 0, submitted.stderr
    assert "submitted job 4242 (r50)" in submitted.stdout
    state = json.loads((tmp_path / "state.json").read_text())
    assert [(job["id"], job["name"], job["label"]) for job in state] == [("4242", "r50", "imagenet-train")]
    assert recorded(tmp_path)[0][:2] == ["batch", "run"]
    tail = ngc_tool(tmp_path, "tail")
    assert tail.returncode == 0 and "epoch 0 step 10" in tail.stdout
    assert recorded(tmp_path)[-1] == ["batch", "exec", "--commandline", "tail -n +1 -f /results/joblog.log", "4242"]


def test_tail_without_a_submitted_job_says_so(tmp_path):
    result = ngc_tool(tmp_path, "tail")
    assert result.returncode == 2 and "no submitted job recorded yet" in result.stderr


def test_kill_takes_only_this_projects_active_jobs_after_confirmation(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps([{"id": "700", "name": "old", "label": "imagenet-train"}]))
    (tmp_path / "list.json").write_text(
        json.dumps(
            [
                {
                    "id": 701,
                    "labels": ["imagenet-train"],
                    "jobDefinition": {"name": "r50"},
                    "jobStatus": {"status": "RUNNING"},
                },
                {
                    "id": 702,
                    "labels": ["someone-else"],
                    "jobDefinition": {"name": "bert"},
                    "jobStatus": {"status": "RUNNING"},
                },
                {"id": 700, "jobDefinition": {"name": "old"}, "jobStatus": {"status": "QUEUED"}},
            ]
        )
    )
    declined = ngc_tool(tmp_path, "kill", stdin="n\n")
    assert declined.returncode == 1 and "nothing killed" in declined.stdout
    assert [call[:2] for call in recorded(tmp_path)] == [["batch", "list"]]
    assert recorded(tmp_path)[0] == [
        "batch",
        "list",
        "--format_type",
        "json",
        "--status",
        "QUEUED",
        "--status",
        "STARTING",
        "--status",
        "RUNNING",
    ]
    killed = ngc_tool(tmp_path, "kill", "--yes")
    assert killed.returncode == 0 and "killed 2 job(s)" in killed.stdout
    assert recorded(tmp_path)[-1] == ["batch", "kill", "701", "700"]


def test_missing_ngc_cli_is_one_line_with_how_to_install(tmp_path):
    values = {"shards": {"server": "bucket", "bucket": {"url": "gs://acme-data/s"}}}
    result = ngc_tool(tmp_path, "submit", "--name", "x", values=values, path="/nonexistent")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "NGC CLI (`ngc`) is not installed" in result.stderr and "ngc config set" in result.stderr


def test_the_image_entrypoint_maps_ngc_array_environment_to_torchrun():
    env = {"NGC_ARRAY_SIZE": "4", "NGC_ARRAY_INDEX": "3", "NGC_GPUS_PER_NODE": "8", "NGC_MASTER_ADDR": "launcher-0"}
    assert resolve(env).torchrun == [
        "--nnodes=4",
        "--node_rank=3",
        "--nproc_per_node=8",
        "--master_addr=launcher-0",
        "--master_port=29500",
    ]
    replica = {"NGC_ARRAY_SIZE": "2", "NGC_REPLICA_ID": "1", "NGC_MASTER_ADDR": "m"}
    assert resolve(replica, nproc="8").torchrun[:3] == ["--nnodes=2", "--node_rank=1", "--nproc_per_node=8"]
