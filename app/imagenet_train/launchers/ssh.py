"""`imagenet-train ssh --hosts FILE -- train ...`: one `imagenet-train launch` per host over SSH.

Host i of the file is node rank i; host 0 is the rendezvous. Each host's output lines come back prefixed with
its name. When one host fails, or on Ctrl-C/SIGTERM, every other host is stopped: its SSH session is closed,
and the remote `imagenet-train ssh-node` then stops training (SIGTERM, SIGKILL after the grace period).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io.storage import IO_ENVIRONMENT
from imagenet_train.launchers.launch import GRACE_PERIOD
from imagenet_train.launchers.remote_words import holds_secret, redact, refuse_control

HOST_LINE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::(?P<port>\d+))?$"
)
# Names whose values are keys, not keys' locations: these never go on a remote command line.
SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|ACCESS_KEY|PRIVATE_KEY|_KEY$|_KEY_ID$")
LOCATION_NAME = re.compile(r"_(FILE|PATH|DIR)$")  # AIS_AUTHN_TOKEN_FILE names a file: that may go


def is_secret(name: str) -> bool:
    """Whether a variable's value is likely a key itself rather than where one is kept."""
    return bool(SECRET_NAME.search(name)) and not LOCATION_NAME.search(name)


@dataclass(frozen=True)
class Host:
    name: str
    user: str = ""
    port: int = 0  # 0: ssh's default

    @property
    def label(self) -> str:
        """How the host's log lines are prefixed."""
        return f"{self.name}:{self.port}" if self.port else self.name


def parse_hosts(path: str) -> list[Host]:
    """Hosts of a hosts file: one `[user@]host[:port]` per line; `#` comments and blank lines are skipped."""
    try:
        with open(path) as stream:
            lines = stream.read().splitlines()
    except OSError as error:
        raise ImagenetTrainError(f"--hosts {path}: cannot read ({error.strerror})") from None
    hosts = []
    for number, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        match = HOST_LINE.match(text)
        port = int(match.group("port")) if match and match.group("port") else 0
        if not match or not 0 <= port <= 65535:
            raise ImagenetTrainError(f"{path}:{number}: expected [user@]host[:port], got '{text}'")
        hosts.append(Host(match.group("host").strip("[]"), match.group("user") or "", port))
    if not hosts:
        raise ImagenetTrainError(f"--hosts {path}: no hosts (one [user@]host[:port] per line)")
    return hosts


def forwarded_environment(env: Mapping[str, str], requested: Sequence[str]) -> dict[str, str]:
    """The variables every host gets: the shard I/O settings present here, plus `--env NAME[=VALUE]`."""
    chosen = {k: v for k, v in env.items() if k.startswith(IO_ENVIRONMENT) and not is_secret(k)}
    for item in requested:
        name, has_value, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ImagenetTrainError(f"--env: expected NAME or NAME=VALUE, got '{item}'")
        if is_secret(name):
            raise ImagenetTrainError(
                f"--env {name}: looks like a secret; keep it in a file on each host and pass the file's location "
                "(e.g. GOOGLE_APPLICATION_CREDENTIALS, AWS_SHARED_CREDENTIALS_FILE)"
            )
        if not has_value and name not in env:
            raise ImagenetTrainError(f"--env {name}: not set here (give NAME=VALUE)")
        chosen[name] = value if has_value else env[name]
    return chosen


@dataclass
class SshLaunchOptions:
    """How to reach the hosts and what to start there."""

    hosts: list[Host]
    program: list[str]  # the imagenet-train command, e.g. ['train', '--shards', URL, ...]
    environment: dict[str, str] = field(default_factory=dict)
    nproc_per_node: str | None = None
    master_addr: str = ""  # default: host 0's name
    master_port: int = 29500
    remote_command: str = "imagenet-train"  # shell words starting imagenet-train on a host
    chdir: str = ""
    identity: str = ""
    ssh_options: list[str] = field(default_factory=list)
    connect_timeout: float = 20
    grace_period: float = GRACE_PERIOD  # launch's: the ranks' time to finish a step and checkpoint


def _check(options: SshLaunchOptions) -> None:
    """Every word that reaches ssh's argv or the remote shell is one line: a newline would start a command."""
    for host in options.hosts:
        refuse_control(host.name, "--hosts")
        refuse_control(host.user, "--hosts")
    for flag, value in (
        ("--master-addr", options.master_addr),
        ("--remote-command", options.remote_command),
        ("--chdir", options.chdir),
        ("--identity", options.identity),
    ):
        refuse_control(value, flag)
    for option in options.ssh_options:
        refuse_control(option, "--ssh-option")
    for word in options.program:
        refuse_control(word, "the command after '--'")
    hidden = stdin_environment(options)
    for name, value in options.environment.items():
        if name not in hidden:
            refuse_control(value, f"environment variable {name}")


def stdin_environment(options: SshLaunchOptions) -> dict[str, str]:
    """The forwarded variables whose values hold a credential (a proxy URL's password): they go on stdin.

    forwarded_environment never picks a secret by name; one set here by a caller still stays off argv.
    """
    return {k: v for k, v in options.environment.items() if holds_secret(v) or is_secret(k)}


def stdin_preamble(options: SshLaunchOptions) -> bytes:
    """What a host's `ssh-node --environment-on-stdin` reads first: those variables, one JSON line."""
    hidden = stdin_environment(options)
    return (json.dumps(hidden, sort_keys=True) + "\n").encode() if hidden else b""


def remote_command(options: SshLaunchOptions, rank: int) -> str:
    """The shell command line one host runs (its node rank and the rendezvous in the environment)."""
    _check(options)
    hidden = stdin_environment(options)
    env = {
        **{k: v for k, v in options.environment.items() if k not in hidden},
        "IMAGENET_TRAIN_NNODES": str(len(options.hosts)),
        "IMAGENET_TRAIN_NODE_RANK": str(rank),
        "IMAGENET_TRAIN_MASTER_ADDR": options.master_addr or options.hosts[0].name,
        "IMAGENET_TRAIN_MASTER_PORT": str(options.master_port),
    }
    nproc = ["--nproc-per-node", options.nproc_per_node] if options.nproc_per_node else []
    # ssh-node waits a little longer than launch's own grace before it kills what is left.
    node = ["ssh-node", "--grace-period", f"{options.grace_period + 10:g}"]
    node += ["--environment-on-stdin", "--"] if hidden else ["--"]
    node += ["launch", "--grace-period", f"{options.grace_period:g}", *nproc, "--"]
    words = ["exec", "env", *(f"{k}={v}" for k, v in sorted(env.items()))]
    line = f"{shlex.join(words)} {options.remote_command} {shlex.join([*node, *options.program])}"
    return f"cd {shlex.quote(options.chdir)} && {line}" if options.chdir else line


def ssh_command(options: SshLaunchOptions, rank: int) -> list[str]:
    """The local `ssh` command for one host: batch mode, no terminal, keep-alives."""
    host = options.hosts[rank]
    argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={options.connect_timeout:g}"]
    argv += ["-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "-o", "LogLevel=ERROR"]
    argv += ["-i", options.identity] if options.identity else []
    argv += ["-p", str(host.port)] if host.port else []
    argv += ["-l", host.user] if host.user else []
    for option in options.ssh_options:
        argv += ["-o", option]
    return [*argv, "--", host.name, remote_command(options, rank)]


def shown_command(options: SshLaunchOptions, rank: int) -> str:
    """One host's ssh command as logs and --dry-run show it: what goes on stdin with passwords as ***."""
    argv = ssh_command(options, rank)
    hidden = stdin_environment(options)
    shown = " ".join(argv[:-1]) + " " + repr(argv[-1])
    if hidden:
        shown += " < stdin: " + " ".join(f"{k}={redact(v)}" for k, v in sorted(hidden.items()))
    return shown


class _Fleet:
    """The local ssh processes, one per host, and the threads relaying their output."""

    def __init__(self, options: SshLaunchOptions) -> None:
        self.options = options
        self.lock = threading.Lock()
        self.processes: list[subprocess.Popen] = []
        self.relays: list[threading.Thread] = []
        self.ended: list[int] = []  # node ranks in the order their ssh ended
        width = max(len(host.label) for host in options.hosts)
        for rank, host in enumerate(options.hosts):
            process = subprocess.Popen(
                ssh_command(options, rank),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C reaches this process only; it stops the hosts in order
            )
            self.processes.append(process)
            preamble = stdin_preamble(options)
            if preamble and process.stdin:  # before anything else: ssh-node reads it before it starts training
                with contextlib.suppress(OSError):
                    process.stdin.write(preamble)
                    process.stdin.flush()
            prefix = f"{host.label:<{width}} | ".encode()
            for stream, target in ((process.stdout, sys.stdout), (process.stderr, sys.stderr)):
                relay = threading.Thread(target=self._relay, args=(stream, target, prefix), daemon=True)
                relay.start()
                self.relays.append(relay)
            threading.Thread(target=self._wait, args=(rank, process), daemon=True).start()

    def _wait(self, rank: int, process: subprocess.Popen) -> None:
        process.wait()
        with self.lock:
            self.ended.append(rank)

    def _relay(self, stream, target, prefix: bytes) -> None:
        # Pieces end at '\n' or '\r', so a host's progress bar updates in place, live, under its prefix.
        pending = b""
        for chunk in iter(lambda: stream.read1(65536), b""):
            pieces = re.split(rb"(?<=\n)|(?<=\r)(?!\n)", pending + chunk)
            pending = pieces.pop()
            if pieces and pieces[-1].endswith(b"\r"):  # '\r\n' may be split across chunks
                pending = pieces.pop() + pending
            if pieces:
                with self.lock:
                    target.buffer.write(b"".join(prefix + piece for piece in pieces))
                    target.buffer.flush()
        if pending:
            with self.lock:
                target.buffer.write(prefix + pending + b"\n")
                target.buffer.flush()

    def say(self, message: str) -> None:
        """One line from this launcher, not from a host."""
        with self.lock:
            print(f"imagenet-train ssh: {message}", file=sys.stderr, flush=True)

    def close_sessions(self) -> None:
        """Ask every host still running to stop: its ssh-node sees the end of its input."""
        for process in self.processes:
            if process.poll() is None and process.stdin and not process.stdin.closed:
                with contextlib.suppress(OSError):
                    process.stdin.close()

    def kill(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signum)


def run(options: SshLaunchOptions) -> int:
    """Start every host, relay their output, stop them all on the first failure or a signal; the worst exit code."""
    names = ", ".join(host.label for host in options.hosts)
    rendezvous = f"{options.master_addr or options.hosts[0].name}:{options.master_port}"
    print(
        f"imagenet-train ssh: starting {len(options.hosts)} hosts ({names}); rendezvous at {rendezvous}",
        file=sys.stderr,
        flush=True,
    )
    fleet = _Fleet(options)
    received: list[int] = []

    def on_signal(signum: int, _frame) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        first_failure = _supervise(fleet, options, received)
    finally:
        fleet.close_sessions()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for relay in fleet.relays:
        relay.join(timeout=5)
    codes = [process.returncode for process in fleet.processes]
    fleet.say("exit codes: " + ", ".join(f"{h.label} {c}" for h, c in zip(options.hosts, codes, strict=True)))
    if first_failure is not None:
        return first_failure[1]  # the cause, not the stops it caused on the other hosts
    worst = max(codes)
    return worst if worst or not received else 128 + received[0]


def _supervise(fleet: _Fleet, options: SshLaunchOptions, received: list[int]) -> tuple[int, int] | None:
    """Wait until every host has ended, stopping them all on the first failure or a signal (`received`); the
    (rank, exit code) of the host that failed first, None when none did."""
    first_failure: tuple[int, int] | None = None
    stop_deadline = None
    while True:
        with fleet.lock:
            ended = list(fleet.ended)
        if first_failure is None and stop_deadline is None:
            first_failure = _first_failure(fleet, options, ended)
        if len(ended) == len(fleet.processes):
            return first_failure
        if (first_failure or received) and stop_deadline is None:
            if received:
                fleet.say(f"{signal.Signals(received[0]).name}: stopping every host")
            fleet.close_sessions()
            stop_deadline = time.monotonic() + options.grace_period + 40
        if stop_deadline is not None and (time.monotonic() > stop_deadline or len(received) > 1):
            fleet.say("hosts did not stop in time; closing their connections")
            fleet.kill(signal.SIGTERM)
            time.sleep(2)
            fleet.kill(signal.SIGKILL)
        time.sleep(0.2)


def _first_failure(fleet: _Fleet, options: SshLaunchOptions, ended: list[int]) -> tuple[int, int] | None:
    """(rank, exit code) of the first of the `ended` hosts that failed, announced; None when none did."""
    failed = [rank for rank in ended if fleet.processes[rank].returncode != 0]
    if not failed:
        return None
    rank, code = failed[0], fleet.processes[failed[0]].returncode
    why = " (ssh: no connection, or it broke)" if code == 255 else ""
    fleet.say(f"{options.hosts[rank].label} exited with {code}{why}; stopping the others")
    return rank, code
