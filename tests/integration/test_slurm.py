"""`imagenet-train slurm` and launch's SLURM_* mapping; a real Slurm (munged, slurmctld, two slurmd) runs the job."""

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.launchers.launch import resolve
from imagenet_train.launchers.slurm import BatchJob, batch_script, expand_nodelist

from conftest import LONG_EPOCH, SMALL_TRAIN, cli, inside_first_epoch, read_metrics

# The second task of a 2-node srun step, as the test cluster sets it (node names changed: 'localhost' resolves).
SRUN_TASK_ON_NODE_1 = {
    "SLURM_JOB_ID": "7",
    "SLURM_JOB_NODELIST": "localhost,n2",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_NODELIST": "localhost,n2",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "localhost,n2",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_GPUS_ON_NODE": "4",
}


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
        ("n1", ["n1"]),
        ("rack[1-2]-node[8-9]", ["rack1-node8", "rack1-node9", "rack2-node8", "rack2-node9"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("a,b[2],c", ["a", "b2", "c"]),
    ],
)
def test_compressed_node_lists_expand_to_hosts_in_order(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["node[1-", "node[a-b]", "node1]", ""])
def test_a_malformed_node_list_is_one_error(nodelist):
    with pytest.raises(ImagenetTrainError, match="node list"):
        expand_nodelist(nodelist)


def test_a_slurm_task_becomes_torchrun_with_node_zero_as_rendezvous():
    launch = resolve(SRUN_TASK_ON_NODE_1)
    assert launch.kind == "slurm"
    assert launch.torchrun == [
        "--nnodes=2",
        "--node_rank=1",
        "--nproc_per_node=4",
        "--master_addr=localhost",
        "--master_port=20007",  # from the job id: two jobs on one node do not collide
    ]
    per_node = resolve({**SRUN_TASK_ON_NODE_1, "SLURM_GPUS_ON_NODE": "", "SLURM_GPUS_PER_NODE": "a100:8"})
    assert "--nproc_per_node=8" in per_node.torchrun
    explicit = resolve({**SRUN_TASK_ON_NODE_1, "MASTER_ADDR": "ib-n1", "MASTER_PORT": "29400"}, nproc="2")
    assert explicit.torchrun[2:] == ["--nproc_per_node=2", "--master_addr=ib-n1", "--master_port=29400"]


def test_a_one_node_batch_script_runs_launch_directly():
    env = {"SLURM_JOB_ID": "3", "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n1"}
    assert resolve(env, nproc="2").torchrun[:4] == [
        "--nnodes=1",
        "--node_rank=0",
        "--nproc_per_node=2",
        "--master_addr=localhost",
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"SLURM_STEP_ID": None}, "batch script of a 2-node Slurm job"),
        ({"SLURM_LOCALID": "1"}, "started task 1 on this node"),
        ({"SLURM_STEP_NUM_NODES": "two"}, "SLURM_NNODES='two'"),
    ],
)
def test_slurm_environments_launch_cannot_serve_are_one_line_errors(change, message):
    env = {**SRUN_TASK_ON_NODE_1, **change}
    env = {k: v for k, v in env.items() if v is not None}
    with pytest.raises(ImagenetTrainError, match=re.escape(message)):
        resolve(env)


def test_the_sbatch_script_starts_one_launch_per_node_and_stops_cleanly_on_the_signal(tmp_path):
    script = tmp_path / "job.sbatch"
    result = cli(
        "slurm",
        *("--nodes", "4", "--gpus-per-node", "8", "--partition", "gpu", "--time", "1-00:00:00"),
        *("--signal", "USR1@300", "--script", str(script), "--executable", "/opt/venv/bin/imagenet-train"),
        *("--sbatch-option=--account=vision", "--", "train", "--shards", "http://s/shards.json", "--epochs", "90"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"sbatch script: {script}"
    text = script.read_text()
    options = [line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH ")]
    assert options == [
        "--job-name=imagenet-train",
        "--nodes=4",
        "--ntasks-per-node=1",
        "--output=imagenet-train-%j.out",
        "--gpus-per-node=8",
        "--partition=gpu",
        "--time=1-00:00:00",
        "--signal=USR1@300",
        "--account=vision",
    ]
    assert (
        "srun --unbuffered --ntasks-per-node=1 /opt/venv/bin/imagenet-train launch --nproc-per-node 8 -- "
        "train --shards http://s/shards.json --epochs 90\n" in text
    )
    assert "requeue" not in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_requeue_resumes_from_the_latest_checkpoint_after_a_clean_stop():
    text = batch_script(BatchJob(program=["train", "--epochs", "90"], nodes=2, requeue=True))
    assert "#SBATCH --requeue" in text and "#SBATCH --open-mode=append" in text
    assert "-- train --epochs 90 --resume latest\n" in text
    assert "if [ $status -eq 138 ] || [ $status -eq 143 ]; then" in text and 'scontrol requeue "$SLURM_JOB_ID"' in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--nodes", "0"], "--nodes: expected a whole number >= 1 and <= 100000, got '0'"),
        (["--signal", "USR1@soon"], "--signal: expected [R:]SIG[@SECONDS] such as USR1@120, got 'USR1@soon'"),
        ([], "expected the imagenet-train command to run after '--', e.g. -- train --shards URL"),
    ],
)
def test_bad_slurm_flags_are_one_line_errors(tmp_path, flags, message):
    program = [] if not flags else ["--", "train"]
    result = cli("slurm", "--script", str(tmp_path / "x.sbatch"), *flags, *program)
    assert result.returncode == 2
    assert result.stderr.strip() == f"imagenet-train: error: {message}"


# --- a real Slurm on this machine: munged, slurmctld and two slurmd ("n1", "n2") ------------------------------


# A stop signal has two outcomes, both as docs/faults.md ("A stop signal during a wait") says: the ranks stop together
# and rank 0 saves the step's position; or the signal finds one rank waiting for its next batch while the other, whose
# batch came, is inside the step's collective, and each leaves without a checkpoint, saying why (the SSH and fault
# tests met the second once each).
UNSAVED_PAIRS = (
    [("0", "in a collective"), ("1", "waiting for the next batch")],
    [("1", "in a collective"), ("0", "waiting for the next batch")],
)


def _stop_outcome(log: str) -> tuple[bool, list[tuple[str, str]]]:
    """Whether rank 0 saved the stop's position, and the ranks' lines saying they left without a checkpoint."""
    saved = re.search(r"stopped by SIGUSR1 at epoch \d+ step \d+: checkpoint .*epoch-\d{4}-step-\d{6}\.pt", log)
    unsaved = re.findall(r"rank (\d): stopped by SIGUSR1 while ([a-z ]+): exiting without a checkpoint", log)
    return saved is not None, sorted(unsaved, key=lambda line: line[1])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {seconds:.0f}s")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A two-node Slurm cluster on 127.0.0.1; yields the environment its client commands need."""
    for daemon in ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd"):
        if not os.path.exists(daemon):
            pytest.fail(f"{daemon} is missing (make launcher-deps installs slurm-wlm and munge)")
    if os.geteuid() != 0:
        pytest.skip("slurmd needs root")
    root = tmp_path_factory.mktemp("slurm")
    for name in ("munge", "state", "log"):
        (root / name).mkdir(mode=0o700)
    (root / "munge" / "munge.key").write_bytes(os.urandom(1024))
    (root / "munge" / "munge.key").chmod(0o600)
    socket_path = root / "munge" / "munge.sock"
    subprocess.run(
        [
            "/usr/sbin/munged",
            "--force",
            f"--key-file={root / 'munge' / 'munge.key'}",
            f"--socket={socket_path}",
            f"--pid-file={root / 'munge' / 'munged.pid'}",
            f"--log-file={root / 'munge' / 'munged.log'}",
            f"--seed-file={root / 'munge' / 'seed'}",
        ],
        check=True,
    )
    nodes = "\n".join(
        f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={_free_port()} CPUs={os.cpu_count()}"
        for name in ("n1", "n2")
    )
    conf = root / "slurm.conf"
    conf.write_text(
        f"""ClusterName=itest
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool-%n"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd-%n.pid"}
SlurmctldLogFile={root / "log" / "slurmctld.log"}
SlurmdLogFile={root / "log" / "slurmd-%n.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=30
{nodes}
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
"""
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = [subprocess.Popen(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(conf)], env=env)]
    daemons += [subprocess.Popen(["/usr/sbin/slurmd", "-D", "-N", n, "-f", str(conf)], env=env) for n in ("n1", "n2")]

    def idle() -> bool:
        shown = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, env=env)
        return sorted(shown.stdout.split()) == ["idle", "idle", "n1", "n2"]

    try:
        _wait(idle, 60, "the two slurmd did not register as idle nodes")
        yield env
    finally:
        subprocess.run(["scancel", "--user=root"], env=env, capture_output=True)
        for daemon in reversed(daemons):
            daemon.terminate()
            daemon.wait(timeout=30)
        pid = int((root / "munge" / "munged.pid").read_text())
        os.kill(pid, 15)


def _steps_done(log: Path) -> bool:
    """Whether rank 0's progress bar shows a few steps of the first epoch (a stop then has a position to save)."""
    return log.exists() and inside_first_epoch(log.read_text())


def _job_state(env: dict, job: str) -> dict:
    shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, env=env)
    return dict(re.findall(r"(\w+)=(\S+)", shown.stdout))


def _submit(env: dict, tmp_path: Path, run_dir: Path, url: str, *extra: str, slurm: tuple = ()) -> str:
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("imagenet-train")),
            "slurm",
            *("--nodes", "2", "--output", str(tmp_path / "job-%j.out"), "--script", str(tmp_path / "job.sbatch")),
            "--submit",
            *slurm,
            *("--", "train", "--shards", url, "--run-dir", str(run_dir), *SMALL_TRAIN, *extra),
        ],
        capture_output=True,
        text=True,
        env={**env, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(_free_port())},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return re.search(r"submitted: job (\d+)", result.stdout).group(1)


@pytest.mark.launchers
@pytest.mark.timeout(900)
def test_a_two_node_slurm_job_trains_the_digits_from_nginx(slurm_cluster, shard_server, tmp_path):
    run_dir = tmp_path / "run"
    job = _submit(slurm_cluster, tmp_path, run_dir, f"{shard_server.url}/shards.json", "--epochs", "3")
    _wait(lambda: _job_state(slurm_cluster, job).get("JobState") not in ("PENDING", "RUNNING"), 900, "job ended")
    state = _job_state(slurm_cluster, job)
    log = (tmp_path / f"job-{job}.out").read_text()
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), log[-4000:]
    assert state["NodeList"] == "n[1-2]"
    assert re.search(r"imagenet-train launch: slurm: torchrun .*--nnodes=2 --node_rank=0", log)
    assert re.search(r"imagenet-train launch: slurm: torchrun .*--nnodes=2 --node_rank=1", log)
    assert "--master_addr=127.0.0.1" in log  # n1 does not resolve: its NodeAddr from scontrol
    metrics = read_metrics(run_dir)
    assert [m["epoch"] for m in metrics] == [0, 1, 2] and all(m["replicas_in_sync"] for m in metrics)
    assert metrics[-1]["val_samples"] == 359 and metrics[-1]["top1"] > 0.5
    assert (run_dir / "checkpoints" / "epoch-0002.pt").is_file()
    print(f"slurm 2 nodes x 1 process, 3 epochs: top-1 {metrics[-1]['top1']:.4f}")


@pytest.mark.launchers
@pytest.mark.timeout(900)
def test_scancel_signal_usr1_stops_training_cleanly_with_a_checkpoint(slurm_cluster, shard_server, tmp_path):
    run_dir = tmp_path / "run"
    job = _submit(slurm_cluster, tmp_path, run_dir, f"{shard_server.url}/shards.json", "--epochs", "50", *LONG_EPOCH)
    _wait(lambda: _steps_done(tmp_path / f"job-{job}.out"), 300, "training did not start")
    subprocess.run(["scancel", "--signal=USR1", job], env=slurm_cluster, check=True)  # as --signal USR1@T does
    _wait(lambda: _job_state(slurm_cluster, job).get("JobState") not in ("PENDING", "RUNNING"), 300, "job ended")
    state = _job_state(slurm_cluster, job)
    log = (tmp_path / f"job-{job}.out").read_text()
    assert state["ExitCode"] == "138:0", log[-4000:]
    saved, unsaved = _stop_outcome(log)
    if saved:
        assert list((run_dir / "checkpoints").glob("epoch-*-step-*.pt")) and unsaved == [], log[-4000:]
    else:
        assert unsaved in UNSAVED_PAIRS, log[-4000:]
        assert not list((run_dir / "checkpoints").glob("*.pt"))
    leftover = subprocess.run(["pgrep", "-f", "--", f"--run-dir {run_dir}"], capture_output=True, text=True).stdout
    assert leftover == ""


@pytest.mark.launchers
@pytest.mark.timeout(900)
def test_requeue_after_a_clean_stop_resumes_and_finishes(slurm_cluster, shard_server, tmp_path):
    run_dir = tmp_path / "run"
    job = _submit(
        slurm_cluster,
        tmp_path,
        run_dir,
        f"{shard_server.url}/shards.json",
        "--epochs",
        "1",
        *LONG_EPOCH,
        slurm=["--requeue"],
    )
    _wait(lambda: _steps_done(tmp_path / f"job-{job}.out"), 300, "training did not start")
    subprocess.run(["scancel", "--signal=USR1", job], env=slurm_cluster, check=True)
    _wait(lambda: _job_state(slurm_cluster, job).get("JobState") == "COMPLETED", 600, "requeued job did not finish")
    state = _job_state(slurm_cluster, job)
    log = (tmp_path / f"job-{job}.out").read_text()  # --open-mode=append: both runs
    assert state["Restarts"] == "1" and state["ExitCode"] == "0:0", log[-4000:]
    assert f"requeueing job {job}" in log
    saved, unsaved = _stop_outcome(log)
    if saved:
        assert re.search(r"resumed from .*epoch-0000-step-\d{6}\.pt", log) and unsaved == [], log[-4000:]
    else:  # nothing saved: the requeued run starts the epoch again
        assert unsaved in UNSAVED_PAIRS and "no checkpoint in" in log, log[-4000:]
    assert [m["epoch"] for m in read_metrics(run_dir)] == [0]
    assert (run_dir / "checkpoints" / "epoch-0000.pt").is_file()
