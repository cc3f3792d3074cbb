"""The sbatch script and the ssh command line: a newline in a flag cannot add a shell line, and a proxy URL's
password never appears on a command line (`ps` on either machine) or in what the launcher prints."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from integration.test_ssh_launch import _tagged, two_hosts  # noqa: F401 (two_hosts: the real-sshd fixture)

from imagenet_train.launchers import ssh
from imagenet_train.launchers.ssh import Host, SshLaunchOptions, forwarded_environment

from conftest import REPO

EXECUTABLE = str(Path(sys.executable).with_name("imagenet-train"))
PROXY = "http://user:secret@proxy:3128"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([EXECUTABLE, *args], capture_output=True, text=True, timeout=120, env=env)


SLURM_FLAGS = [
    (["--job-name", "x\ntouch MARKER"], "--job-name"),
    (["--partition", "gpu\ntouch MARKER"], "--partition"),
    (["--time", "1:00:00\ntouch MARKER"], "--time"),
    (["--output", "log\ntouch MARKER"], "--output"),
    (["--sbatch-option=--account=x\ntouch MARKER"], "--sbatch-option"),
]


@pytest.mark.parametrize("flags,flag", SLURM_FLAGS, ids=[f for _, f in SLURM_FLAGS])
def test_a_newline_in_a_slurm_flag_is_one_line_error_and_no_script(tmp_path, marker, flags, flag):
    script = tmp_path / "job.sbatch"
    hostile = [f.replace("MARKER", str(marker)) for f in flags]
    result = _cli("slurm", "--script", str(script), *hostile, "--", "train", "--epochs", "1")
    assert result.returncode == 2, result.stdout
    assert (
        result.stderr.startswith(f"imagenet-train: error: {flag}: control characters")
        and result.stderr.count("\n") == 1
    )
    assert not script.exists() and not marker.exists()


def test_a_newline_in_the_command_after_the_dashes_is_refused_for_slurm(tmp_path):
    result = _cli("slurm", "--script", str(tmp_path / "j.sbatch"), "--", "train", "--arch", "x\nid")
    assert result.returncode == 2 and "the command after '--': control characters" in result.stderr


def test_the_ngc_tail_command_keeps_a_result_dir_one_shell_word():
    from chartkit.ngc_jobs import tail_command

    argv = tail_command("42", "/results; touch MARKER")
    assert shlex.split(argv[argv.index("--commandline") + 1]) == [
        "tail",
        "-n",
        "+1",
        "-f",
        "/results; touch MARKER/joblog.log",
    ]
    assert tail_command("42")[4] == "tail -n +1 -f /results/joblog.log"  # the usual line is unchanged


def _options(environment: dict[str, str]) -> SshLaunchOptions:
    return SshLaunchOptions(
        hosts=[Host("gpu1"), Host("gpu2")], program=["train", "--epochs", "1"], environment=environment
    )


def test_a_proxy_password_never_reaches_the_ssh_command_line():
    env = forwarded_environment({"HTTPS_PROXY": PROXY, "NO_PROXY": "localhost", "HOME": "/root"}, [])
    for rank in range(2):
        argv = ssh.ssh_command(_options(env), rank)
        assert not [word for word in argv if "secret" in word], argv
        assert "NO_PROXY=localhost" in argv[-1]  # ordinary settings still go as before
    # What the host's ssh-node reads first on stdin: the variable itself, whole.
    assert ssh.stdin_preamble(_options(env)) == b'{"HTTPS_PROXY": "http://user:secret@proxy:3128"}\n'
    # A secret by name is never picked from the environment; one a caller sets still stays off argv.
    assert "AWS_SESSION_TOKEN" not in forwarded_environment({"AWS_SESSION_TOKEN": "t0k3n"}, [])
    argv = ssh.ssh_command(_options({"AWS_SESSION_TOKEN": "t0k3n"}), 0)
    assert "t0k3n" not in " ".join(argv) and b"t0k3n" in ssh.stdin_preamble(_options({"AWS_SESSION_TOKEN": "t0k3n"}))


def test_dry_run_shows_the_proxy_with_its_password_redacted(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("gpu1\ngpu2\n")
    env = {**os.environ, "HTTPS_PROXY": PROXY}
    result = _cli("ssh", "--hosts", str(hosts), "--dry-run", "--", "train", env=env)
    assert result.returncode == 0, result.stderr
    assert "secret" not in result.stdout + result.stderr
    assert result.stdout.count("HTTPS_PROXY=http://user:***@proxy:3128") == 2


SSH_FLAGS = [
    (["--master-addr", "gpu1\nid"], "--master-addr"),
    (["--chdir", "/w\nid"], "--chdir"),
    (["--ssh-option", "User=x\nid"], "--ssh-option"),
    (["--env", "NCCL_DEBUG=INFO\nid"], "environment variable NCCL_DEBUG"),
]


@pytest.mark.parametrize("flags,what", SSH_FLAGS, ids=[f[0] for f, _ in SSH_FLAGS])
def test_a_control_character_in_an_ssh_value_is_one_line_error(tmp_path, flags, what):
    hosts = tmp_path / "hosts"
    hosts.write_text("gpu1\n")
    result = _cli("ssh", "--hosts", str(hosts), *flags, "--dry-run", "--", "train")
    assert result.returncode == 2, result.stdout
    assert (
        result.stderr
        == f"imagenet-train: error: {what}: control characters are not allowed, got "
        + repr(flags[-1].partition("=")[2] if what.startswith("environment") else flags[-1])
        + "\n"
    )


def test_ssh_node_gives_the_stdin_variables_to_the_command_but_not_to_any_command_line(tmp_path):
    """What a host runs: `ssh-node --environment-on-stdin` reads the preamble `imagenet-train ssh` sends."""
    preamble = ssh.stdin_preamble(_options({"HTTPS_PROXY": PROXY}))
    pid_file = tmp_path / "serve.pid"
    node = subprocess.Popen(
        [EXECUTABLE, "ssh-node", "--grace-period", "5", "--environment-on-stdin", "--", "serve", str(tmp_path)]
        + ["--port", "0", "--pid-file", str(pid_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        node.stdin.write(preamble)
        node.stdin.flush()
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert node.poll() is None and time.monotonic() < deadline, "serve did not start under ssh-node"
            time.sleep(0.1)
        serve = int(pid_file.read_text())
        environ = Path(f"/proc/{serve}/environ").read_bytes().split(b"\0")
        assert f"HTTPS_PROXY={PROXY}".encode() in environ
        for pid in (node.pid, serve):
            assert b"secret" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        node.stdin.close()  # the session ends: serve stops cleanly
        assert node.wait(timeout=60) == 0
    finally:
        if node.poll() is None:
            os.killpg(node.pid, 9)


def test_ssh_node_refuses_a_malformed_stdin_preamble():
    result = subprocess.run(
        [EXECUTABLE, "ssh-node", "--environment-on-stdin", "--", "train"],
        input='["not", "an", "object"]\n',
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--environment-on-stdin: expected a JSON object" in result.stderr


@pytest.mark.launchers
@pytest.mark.timeout(300)
def test_over_real_ssh_the_proxy_password_reaches_the_command_but_no_argv(two_hosts, tmp_path):  # noqa: F811
    """A real sshd on 127.0.0.1: ssh, sshd's session, the remote shell, ssh-node, launch, torchrun and the
    command it runs (serve) all start without the password in argv; the command's environment has it."""
    hosts, access = two_hosts
    one_host = tmp_path / "one-host"
    one_host.write_text(hosts.read_text().splitlines()[1] + "\n")
    tag = f"IMAGENET_TRAIN_TEST_TAG={uuid.uuid4().hex}"
    pid_file = tmp_path / "serve.pid"
    command = [EXECUTABLE, "ssh", "--hosts", str(one_host), *access, "--nproc-per-node", "1"]
    command += ["--remote-command", EXECUTABLE, "--env", f"PYTHONPATH={REPO / 'app'}", "--env", tag, "--"]
    command += ["serve", str(tmp_path), "--port", "0", "--pid-file", str(pid_file)]
    local = subprocess.Popen(
        command, env={**os.environ, "HTTPS_PROXY": PROXY}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 180
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert local.poll() is None and time.monotonic() < deadline, local.stdout.read().decode()[-3000:]
            time.sleep(0.2)
        serve = int(pid_file.read_text())
        assert f"HTTPS_PROXY={PROXY}".encode() in Path(f"/proc/{serve}/environ").read_bytes().split(b"\0")
        leaks = [pid for pid in _pids() if b"secret" in _cmdline(pid)]
        assert leaks == [], [_cmdline(pid) for pid in leaks]
        assert _tagged(tag), "the host's processes carry the test's tag"
    finally:
        local.send_signal(signal.SIGTERM)  # stops the host: its ssh-node ends serve
        output = local.communicate(timeout=120)[0].decode()
    assert "secret" not in output
    assert _tagged(tag) == []


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
