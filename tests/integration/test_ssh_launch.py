"""`imagenet-train ssh`: hosts files, the remote command, and real training over two real OpenSSH servers."""

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.launchers.launch import resolve
from imagenet_train.launchers.ssh import Host, SshLaunchOptions, forwarded_environment, parse_hosts, remote_command
from imagenet_train.launchers.ssh_node import descendants

from conftest import LONG_EPOCH, REPO, SMALL_TRAIN, cli, inside_first_epoch, read_metrics

SSHD = "/usr/sbin/sshd"
EXECUTABLE = str(Path(sys.executable).with_name("imagenet-train"))


def test_hosts_file_gives_hosts_in_node_rank_order(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two GPU boxes\nalice@gpu1.example:2222\n\n  gpu2   # the second\n[::1]:22\n")
    assert parse_hosts(str(hosts)) == [Host("gpu1.example", "alice", 2222), Host("gpu2"), Host("::1", "", 22)]


@pytest.mark.parametrize("line", ["gpu1 gpu2", "gpu1:ssh", "@gpu1", "gpu1:99999"])
def test_a_bad_hosts_line_is_one_error_naming_the_file_and_line(tmp_path, line):
    hosts = tmp_path / "hosts"
    hosts.write_text(f"gpu0\n{line}\n")
    result = cli("ssh", "--hosts", str(hosts), "--", "train")
    assert result.returncode == 2
    assert result.stderr.strip() == f"imagenet-train: error: {hosts}:2: expected [user@]host[:port], got '{line}'"


def test_an_empty_hosts_file_is_an_error(tmp_path):
    (tmp_path / "hosts").write_text("# nobody\n")
    with pytest.raises(ImagenetTrainError, match="no hosts"):
        parse_hosts(str(tmp_path / "hosts"))


def test_io_settings_and_named_variables_go_to_the_hosts_but_never_a_secret():
    env = {
        "GOOGLE_APPLICATION_CREDENTIALS": "/etc/keys/sa.json",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "AWS_SESSION_TOKEN": "t0k3n",
        "AWS_SHARED_CREDENTIALS_FILE": "/etc/keys/aws",
        "AIS_AUTHN_TOKEN_FILE": "/etc/keys/ais-token",
        "HOME": "/root",
        "OMP_NUM_THREADS": "4",
    }
    chosen = forwarded_environment(env, ["OMP_NUM_THREADS", "NCCL_DEBUG=INFO"])
    assert chosen == {
        "GOOGLE_APPLICATION_CREDENTIALS": "/etc/keys/sa.json",
        "AWS_SHARED_CREDENTIALS_FILE": "/etc/keys/aws",
        "AIS_AUTHN_TOKEN_FILE": "/etc/keys/ais-token",
        "OMP_NUM_THREADS": "4",
        "NCCL_DEBUG": "INFO",
    }
    with pytest.raises(ImagenetTrainError, match="--env AWS_SECRET_ACCESS_KEY: looks like a secret"):
        forwarded_environment(env, ["AWS_SECRET_ACCESS_KEY"])
    with pytest.raises(ImagenetTrainError, match="--env MISSING: not set here"):
        forwarded_environment(env, ["MISSING"])


def test_each_host_gets_its_node_rank_and_host_zero_as_rendezvous():
    options = SshLaunchOptions(
        hosts=[Host("gpu1"), Host("gpu2", "bob", 2222)],
        program=["train", "--run-dir", "/runs/it's here", "--shards", "http://gpu1:8080/shards.json"],
        environment={"OMP_NUM_THREADS": "4"},
        nproc_per_node="8",
        master_port=29511,
        remote_command="/opt/venv/bin/imagenet-train",
    )
    words = shlex.split(remote_command(options, 1))  # as the remote shell splits it
    assert words[:2] == ["exec", "env"]
    env = dict(word.split("=", 1) for word in words[2 : words.index("/opt/venv/bin/imagenet-train")])
    assert env["OMP_NUM_THREADS"] == "4"
    program = words[words.index("/opt/venv/bin/imagenet-train") + 1 :]
    assert program[:3] == ["ssh-node", "--grace-period", "90"]  # launch's 80 s, then SIGKILL
    assert program[4:7] == ["launch", "--grace-period", "80"]
    assert program[-5:] == ["train", "--run-dir", "/runs/it's here", "--shards", "http://gpu1:8080/shards.json"]
    nproc = program[program.index("--nproc-per-node") + 1]
    assert resolve(env, nproc).torchrun == [
        "--nnodes=2",
        "--node_rank=1",
        "--nproc_per_node=8",
        "--master_addr=gpu1",
        "--master_port=29511",
    ]


# --- real OpenSSH servers on 127.0.0.1 as two "hosts" -------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def two_hosts(tmp_path):
    """Two sshd on 127.0.0.1 (own host keys, one authorised temp user key) and a hosts file naming them."""
    if not (os.path.exists(SSHD) and shutil.which("ssh")):
        pytest.fail("openssh-server and openssh-client are needed (make launcher-deps)")
    if os.geteuid() != 0:
        pytest.skip("sshd logins need root here (CI runs as root)")
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
    ssh_dir = tmp_path / "ssh"
    ssh_dir.mkdir()
    user_key = ssh_dir / "user_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(user_key)], check=True)
    (ssh_dir / "authorized_keys").write_text((ssh_dir / "user_key.pub").read_text())
    servers, known, lines = [], [], []
    for name in ("a", "b"):
        host_key = ssh_dir / f"host_key_{name}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
        port = _free_port()
        config = ssh_dir / f"sshd_config_{name}"
        config.write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {ssh_dir}/sshd_{name}.pid\n"
            f"AuthorizedKeysFile {ssh_dir}/authorized_keys\nStrictModes no\nUsePAM no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        )
        log = open(ssh_dir / f"sshd_{name}.log", "w")  # noqa: SIM115 (closed below)
        servers.append((subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=log), log))
        key_type, key = (host_key.with_suffix(".pub")).read_text().split()[:2]
        known.append(f"[127.0.0.1]:{port} {key_type} {key}\n")
        lines.append(f"root@127.0.0.1:{port}\n")
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or servers[-1][0].poll() is not None:
                    pytest.fail(f"sshd did not start: {(ssh_dir / f'sshd_{name}.log').read_text()}")
                time.sleep(0.1)
    (ssh_dir / "known_hosts").write_text("".join(known))
    hosts = tmp_path / "hosts"
    hosts.write_text("# two sshd on this machine\n" + "".join(lines))
    access = [
        "--identity",
        str(user_key),
        "--ssh-option",
        f"UserKnownHostsFile={ssh_dir}/known_hosts",
        "--ssh-option",
        "StrictHostKeyChecking=yes",
    ]
    yield hosts, access
    for server, log in servers:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def _tagged(tag: str) -> list[int]:
    """Processes whose environment carries this test's tag (every process the launch started on a host)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if tag.encode() in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _ssh_train(
    hosts: Path, access: list[str], tag: str, run_dir: Path, url: str, *extra: str, grace: int = 60
) -> list[str]:
    return [
        EXECUTABLE,
        "ssh",
        "--hosts",
        str(hosts),
        *access,
        "--nproc-per-node",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        "--remote-command",
        EXECUTABLE,
        "--chdir",
        str(REPO),
        "--grace-period",
        str(grace),
        "--env",
        f"PYTHONPATH={REPO / 'app'}",
        "--env",
        "OMP_NUM_THREADS=1",
        "--env",
        tag,
        "--",
        "train",
        "--shards",
        url,
        "--run-dir",
        str(run_dir),
        *SMALL_TRAIN,
        *extra,
    ]


@pytest.mark.launchers
@pytest.mark.timeout(900)
def test_two_hosts_over_ssh_train_the_digits_from_nginx(two_hosts, shard_server, tmp_path):
    hosts, access = two_hosts
    tag = f"IMAGENET_TRAIN_TEST_TAG={uuid.uuid4().hex}"
    run_dir = tmp_path / "run"
    command = _ssh_train(hosts, access, tag, run_dir, f"{shard_server.url}/shards.json", "--epochs", "3")
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    labels = [line.split("@", 1)[1].strip() for line in hosts.read_text().splitlines()[1:]]
    for rank, label in enumerate(labels):  # every host's lines come back prefixed with its name
        launched = rf"{label} \| imagenet-train launch: ssh: torchrun .*--nnodes=2 --node_rank={rank}"
        assert re.search(launched, result.stdout)
    metrics = read_metrics(run_dir)
    assert [m["epoch"] for m in metrics] == [0, 1, 2]
    assert all(m["replicas_in_sync"] for m in metrics)
    assert metrics[-1]["val_samples"] == 359 and metrics[-1]["top1"] > 0.5
    assert (run_dir / "checkpoints" / "epoch-0002.pt").is_file()
    print(f"ssh 2 nodes x 1 process, 3 epochs: top-1 {metrics[-1]['top1']:.4f}")
    assert _tagged(tag) == []


@pytest.mark.launchers
@pytest.mark.timeout(900)
def test_a_killed_host_stops_the_other_and_leaves_no_training_process(two_hosts, shard_server, tmp_path):
    hosts, access = two_hosts
    tag = f"IMAGENET_TRAIN_TEST_TAG={uuid.uuid4().hex}"
    run_dir = tmp_path / "run"
    url = f"{shard_server.url}/shards.json"
    command = _ssh_train(hosts, access, tag, run_dir, url, "--epochs", "50", grace=20)
    with open(tmp_path / "out.txt", "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "config.json").exists():  # both hosts are past the rendezvous
            assert process.poll() is None, (tmp_path / "out.txt").read_text()[-4000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.5)
        # Host a's rank is frozen, so only the launcher can stop host a; host b's torchrun agent is killed
        # outright, which orphans its rank: neither may survive.
        environments = {pid: Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") for pid in _tagged(tag)}
        commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in environments}

        def on_host(rank: int, role: str) -> list[int]:
            return [
                pid
                for pid, env in environments.items()
                if f"IMAGENET_TRAIN_NODE_RANK={rank}".encode() in env
                and (role == "rank") == any(item.startswith(b"LOCAL_RANK=") for item in env)
                and b"ssh-node" not in commands[pid]
            ]

        os.kill(min(on_host(0, "rank")), signal.SIGSTOP)
        os.kill(min(on_host(1, "agent")), signal.SIGKILL)
        code = process.wait(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    output = (tmp_path / "out.txt").read_text()
    assert code == 128 + signal.SIGKILL, output[-4000:]
    assert "exited with 137; stopping the others" in output
    left = _tagged(tag)
    assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]
    assert not (run_dir / "checkpoints" / "epoch-0049.pt").exists()


@pytest.mark.launchers
@pytest.mark.timeout(900)
def test_ctrl_c_stops_every_host_and_leaves_no_training_process(two_hosts, shard_server, tmp_path):
    hosts, access = two_hosts
    tag = f"IMAGENET_TRAIN_TEST_TAG={uuid.uuid4().hex}"
    run_dir = tmp_path / "run"
    command = _ssh_train(hosts, access, tag, run_dir, f"{shard_server.url}/shards.json", "--epochs", "50", *LONG_EPOCH)
    with open(tmp_path / "out.txt", "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        # A few steps done (rank 0's progress bar), so the stop has a position to save.
        while not inside_first_epoch((tmp_path / "out.txt").read_text()):
            assert process.poll() is None, (tmp_path / "out.txt").read_text()[-4000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
        code = process.wait(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    output = (tmp_path / "out.txt").read_text()
    assert "imagenet-train ssh: SIGINT: stopping every host" in output
    assert code == 128 + signal.SIGTERM, output[-4000:]  # every host stopped as a pre-emption
    assert re.search(r"\| imagenet-train launch: stopped by SIGTERM; the ranks' lines above say where", output)
    # Two outcomes, both as docs/faults.md ("A stop signal during a wait") says: the ranks stop together (at a step's
    # vote, or both waiting for the same next batch) and rank 0 saves the position; or the signal finds one rank
    # waiting for its next batch while the other, whose batch came, is inside the step's collective waiting for it,
    # and each leaves without a checkpoint saying why. (make launchers met the second once; 13 runs alone met the
    # first; pausing rank 0's loader processes just before the signal gives the second every time.)
    saved = re.search(
        r"\| stopped by SIGTERM at epoch \d+ step \d+: checkpoint (\S+epoch-\d{4}-step-\d{6}\.pt);", output
    )
    unsaved = re.findall(r"\| rank (\d): stopped by SIGTERM while ([a-z ]+): exiting without a checkpoint", output)
    if saved:
        assert Path(saved[1]).is_file() and unsaved == [], output[-4000:]
    else:
        assert sorted(unsaved, key=lambda line: line[1]) in (
            [("0", "in a collective"), ("1", "waiting for the next batch")],
            [("1", "in a collective"), ("0", "waiting for the next batch")],
        ), output[-4000:]
        assert not list(run_dir.glob("checkpoints/*.pt"))
    assert _tagged(tag) == []


# --- ssh-node, what each host runs: tested here on a long-running command (a real nginx via `serve`) --------


def _start_node(tmp_path: Path) -> tuple[subprocess.Popen, int, list[int]]:
    """`ssh-node -- serve DIR`; returns it, serve's pid and the pids below serve (nginx) once it serves."""
    pid_file = tmp_path / "serve.pid"
    node = subprocess.Popen(
        [EXECUTABLE, "ssh-node", "--grace-period", "5", "--", "serve", str(tmp_path), "--port", "0"]
        + ["--pid-file", str(pid_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert node.poll() is None and time.monotonic() < deadline, "serve did not start under ssh-node"
        time.sleep(0.1)
    serve = int(pid_file.read_text())
    return node, serve, descendants(serve)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_ssh_node_stops_its_command_when_the_session_ends(tmp_path):
    node, serve, below = _start_node(tmp_path)
    assert below, "nginx should run below serve"
    node.stdin.close()  # what the host sees when the ssh connection closes
    assert node.wait(timeout=60) == 0  # serve stops cleanly on SIGTERM
    survivors = [pid for pid in [serve, *below] if _alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == []


def test_ssh_node_kills_what_a_killed_command_left_behind(tmp_path):
    node, serve, below = _start_node(tmp_path)
    try:
        os.kill(serve, signal.SIGKILL)  # nginx is orphaned; ssh-node, a subreaper, inherits and ends it
        assert node.wait(timeout=60) == 128 + signal.SIGKILL
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
    survivors = [pid for pid in below if _alive(pid)]
    for pid in survivors:  # do not leave them to the machine when the check fails
        os.kill(pid, signal.SIGKILL)
    assert below and survivors == []


def test_a_killed_ssh_node_stops_its_command_and_what_runs_below_it(tmp_path):
    node, serve, below = _start_node(tmp_path)
    os.kill(node.pid, signal.SIGKILL)  # no cleanup of its own can run: its command must see it gone
    node.wait()
    deadline = time.monotonic() + 30
    while any(map(_alive, [serve, *below])) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [pid for pid in [serve, *below] if _alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert below and survivors == []


@pytest.mark.launchers
@pytest.mark.timeout(120)
def test_the_first_host_to_fail_stops_the_others_and_gives_its_exit_code(two_hosts, tmp_path):
    hosts, access = two_hosts
    # In place of imagenet-train on each host: node 1 fails at once, node 0 runs until its session is closed.
    script = tmp_path / "node.sh"
    script.write_text('[ "$IMAGENET_TRAIN_NODE_RANK" = 1 ] && exit 3\ncat >/dev/null\nexit 0\n')
    started = time.monotonic()
    result = cli("ssh", "--hosts", str(hosts), *access, "--remote-command", f"sh {script}", "--", "train", timeout=90)
    assert result.returncode == 3, result.stderr
    assert re.search(r"127\.0\.0\.1:\d+ exited with 3; stopping the others", result.stderr), result.stderr
    assert re.search(r"exit codes: \S+ 0, \S+ 3", result.stderr), result.stderr
    assert time.monotonic() - started < 60  # node 0 stopped when its session closed, not by the kill deadline


@pytest.mark.launchers
@pytest.mark.timeout(120)
def test_a_signal_to_the_launcher_closes_every_session_and_exits_128_plus_it(two_hosts, tmp_path):
    hosts, access = two_hosts
    script = tmp_path / "node.sh"  # each host: say it started, then run until its session is closed
    script.write_text(f"touch {tmp_path}/started.$IMAGENET_TRAIN_NODE_RANK\ncat >/dev/null\nexit 0\n")
    command = [EXECUTABLE, "ssh", "--hosts", str(hosts), *access, "--remote-command", f"sh {script}", "--", "train"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"started.{rank}").exists() for rank in (0, 1)):
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGINT, stderr
    assert "SIGINT: stopping every host" in stderr and "did not stop in time" not in stderr, stderr
