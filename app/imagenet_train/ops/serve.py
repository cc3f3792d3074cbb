"""Serving a shard directory with a real nginx: own config, prefix, pid and logs in a private directory.

Least privilege: nginx serves the shard folder and nothing else (the shared config refuses symlinks whose
owner differs from their target's), and when started as root its workers run as `nobody`, never as root.
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.ops.ports import port_holder, port_taken

MAIN_CONFIG = """\
daemon off;
{user}
worker_processes {workers};
pid {state}/nginx.pid;
error_log {state}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log {access_log};
    client_body_temp_path {state}/client_body;
    proxy_temp_path {state}/proxy;
    fastcgi_temp_path {state}/fastcgi;
    uwsgi_temp_path {state}/uwsgi;
    scgi_temp_path {state}/scgi;
    server {{
        listen {host}:{port};
        root {root};
        add_header {token_header} {token} always;
        include {tuning};
    }}
}}
"""


# `nobody` owns no files, so a worker running as it reads only what every user may read. Not a distribution's
# web user (www-data, nginx): other services on the host may share it and own files as it.
WORKER_USER = "nobody"
# Each server's answers carry its own random token: the start-up check knows that our nginx answers, not
# another server that held the port first (nginx retries a busy port for seconds before it gives up).
TOKEN_HEADER = "X-Imagenet-Train-Server"


def _can_list(folder: Path, uid: int, gid: int) -> bool:
    """Whether `uid` (with only group `gid`) may list `folder`, asked of the kernel by a child running as them."""
    check = ["/bin/sh", "-c", 'test -r "$1" && test -x "$1"', "sh", str(folder)]
    return subprocess.run(check, user=uid, group=gid, extra_groups=[], capture_output=True).returncode == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def nginx_binary() -> str:
    """The nginx executable's path; a one-line error when nginx is not installed."""
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)
    if not found:
        raise ImagenetTrainError("nginx: not installed (apt-get install -y nginx)")
    return found


class NginxServer:
    """A shard server on host:port for `root`; use as a context manager, stopped by its pid."""

    def __init__(self, root: str, host: str = "127.0.0.1", port: int = 0, workers: int = 2, access_log: bool = False):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ImagenetTrainError(f"{root}: shard directory does not exist")
        self.host, self.port, self.workers = host, port or free_port(host), workers
        self.access_log = access_log
        self.token = secrets.token_hex(8)
        self.user = self._user_directive()  # started as root: fails here, before anything is written
        self.state: Path | None = None
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The server's base URL, http://host:port."""
        return f"http://{self.host}:{self.port}"

    def config_text(self, state: Path) -> str:
        """The nginx.conf that serves `root`, keeping its pid file and logs in `state`."""
        tuning = resources.files("imagenet_train") / "nginx" / "nginx.conf"
        return MAIN_CONFIG.format(
            user=self.user,
            workers=self.workers,
            state=state,
            host=self.host,
            port=self.port,
            root=self.root,
            token_header=TOKEN_HEADER,
            token=self.token,
            tuning=tuning,
            access_log=f"{state}/access.log" if self.access_log else "off",
        )

    def _user_directive(self) -> str:
        # Not root: nginx cannot change user, its workers are this user. Root: its workers would stay root
        # (able to read /etc/shadow through a link) unless told otherwise, so they become WORKER_USER.
        if os.geteuid() != 0:
            return ""
        try:
            user = pwd.getpwnam(WORKER_USER)
        except KeyError:
            raise ImagenetTrainError(f"nginx as root runs its workers as '{WORKER_USER}': no such user") from None
        group = grp.getgrgid(user.pw_gid).gr_name
        if not _can_list(self.root, user.pw_uid, user.pw_gid):
            raise ImagenetTrainError(
                f"{self.root}: nginx started as root serves as '{WORKER_USER}', who cannot read this folder; "
                f"make it readable (chmod o+rx on it, o+x on its parents) or serve as its owner"
            )
        return f"user {WORKER_USER} {group};"

    def start(self, timeout: float = 10.0) -> NginxServer:
        """Start nginx and return once it answers; a one-line error if the port is taken, nginx fails or is silent."""
        if port_taken(self.host, self.port):
            raise self.busy()
        self.state = Path(tempfile.mkdtemp(prefix="imagenet-train-nginx-"))
        config = self.state / "nginx.conf"
        config.write_text(self.config_text(self.state))
        self.process = process = subprocess.Popen(
            [nginx_binary(), "-p", str(self.state), "-c", str(config), "-e", str(self.state / "error.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise self.failed(process)
            if self.answers():
                return self
            time.sleep(0.05)
        self.stop()
        raise ImagenetTrainError(f"nginx on {self.host}:{self.port}: no answer within {timeout:.0f}s")

    def answers(self) -> bool:
        """Whether this nginx (its token in the answer) serves the URL; another server answering there is not it."""
        try:
            with urllib.request.urlopen(self.url + "/", timeout=1) as response:
                return response.headers.get(TOKEN_HEADER) == self.token
        except urllib.error.HTTPError as error:
            if error.headers.get(TOKEN_HEADER) != self.token:
                return False
            self.stop()
            raise ImagenetTrainError(f"nginx on {self.url} answers HTTP {error.code} for {self.root}") from None
        except OSError:
            return False

    def busy(self) -> ImagenetTrainError:
        """The error for a port another process holds, naming it where /proc says."""
        holder = port_holder(self.port)
        return ImagenetTrainError(
            f"{self.host}:{self.port}: already in use{f' by {holder}' if holder else ''}; "
            f"stop that server or choose another --port (0: a free one)"
        )

    def failed(self, process: subprocess.Popen) -> ImagenetTrainError:
        """The error for an nginx that exited while starting: its last line (a taken port said as such)."""
        error = ((process.stderr.read() if process.stderr else None) or b"").decode().strip().splitlines()
        if any("Address already in use" in line for line in error):
            return self.busy()  # taken between the check and nginx's bind
        last = error[-1] if error else f"exit {process.returncode}"
        return ImagenetTrainError(f"nginx on {self.host}:{self.port} failed to start: {last}")

    @property
    def pid(self) -> int | None:
        """The nginx master's pid (None before it started)."""
        return self._master_pid(self.process) if self.process else None

    def _master_pid(self, process: subprocess.Popen) -> int:
        # The pid file once nginx wrote it, else the process started (the master either way).
        pid_file = self.state / "nginx.pid" if self.state else None
        if pid_file and pid_file.exists():
            return int(pid_file.read_text().strip())
        return process.pid

    def start_again(self, timeout: float = 30.0) -> NginxServer:
        """Start nginx again on its port after a stop: the port may stay in TIME_WAIT for a moment, so a failed
        start is retried until `timeout` (then its error line)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.start()
            except ImagenetTrainError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def running(self) -> bool:
        """Whether the nginx this server started is still running."""
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Stop nginx and remove its state folder."""
        if self.process and self.process.poll() is None:
            os.kill(self._master_pid(self.process), signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.state:
            shutil.rmtree(self.state, ignore_errors=True)
        self.process = None

    def __enter__(self) -> NginxServer:
        try:
            return self.start()
        except BaseException:  # a signal's SystemExit mid-start too: never leave an nginx nobody stops
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
