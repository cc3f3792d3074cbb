"""Dot names left in a shard folder (`.git/config`, `.env`, `.netrc`, a dotfile in a sub-folder) are never
served: `imagenet-train serve`'s nginx and the chart's shard server, whose ConfigMap is rendered by helm 4
and helm 3 and run here with a real nginx, answer 404 while shards and the index are still served."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from imagenet_train.ops.serve import NginxServer, free_port, nginx_binary

from conftest import REPO as ROOT

CHART = ROOT / "helm" / "imagenet-train"
TOOLS = ROOT / ".tools" / "bin"
SECRETS = {
    ".git/config": b"[remote]\n\turl = https://user:token@git.example/repo\n",
    ".env": b"AWS_SECRET_ACCESS_KEY=planted\n",
    ".netrc": b"machine example login me password planted\n",
    "train/.hidden": b"planted",
    ".well-known/acme-challenge/x": b"planted",
    ".shards.json.abc.tmp": b"{}",
}
# The same files asked for as a client could spell them: encoded, through `..`, doubled slashes.
SPELLINGS = ["/%2eenv", "/train/../.env", "//.git/config", "/train/%2Ehidden", "/.git/"]


def _answer(url: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""


def _raw_path(base: str, path: str) -> tuple[int, bytes]:
    """GET `path` byte for byte (urllib would normalise `..` and `//` before sending)."""
    import http.client

    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.putrequest("GET", path, skip_accept_encoding=True)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A shard folder with an index, a shard, and the dotfiles someone left beside them."""
    folder = tmp_path / "shards"
    (folder / "train").mkdir(parents=True)
    (folder / "shards.json").write_text('{"splits": {}}')
    (folder / "train" / "a-000000.tar").write_bytes(b"shard")
    for name, data in SECRETS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def _assert_no_dot_name_is_served(base: str) -> None:
    assert _answer(f"{base}/shards.json") == (200, b'{"splits": {}}')
    assert _answer(f"{base}/train/a-000000.tar") == (200, b"shard")
    served = {name: _answer(f"{base}/{name}") for name in SECRETS}
    assert served == dict.fromkeys(SECRETS, (404, b"")), served
    spelled = {path: _raw_path(base, path)[0] for path in SPELLINGS}
    assert set(spelled.values()) <= {400, 404}, spelled
    listing = _answer(f"{base}/")[1].decode()
    assert ".env" not in listing and "shards.json" in listing


def test_serve_answers_404_for_dot_names_and_still_serves_shards(planted):
    with NginxServer(str(planted)) as server:
        _assert_no_dot_name_is_served(server.url)


def _chart_config_map(helm: str) -> dict[str, str]:
    """The shard server's ConfigMap files as `helm template` renders them with the chart's defaults."""
    if not (TOOLS / helm).exists():
        pytest.fail(f"{TOOLS / helm} is missing: run `make k8s-tools`")
    command = [str(TOOLS / helm), "template", "dots", str(CHART), "--show-only", "templates/shard-server.yaml"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    maps = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "ConfigMap"]
    assert len(maps) == 1
    return maps[0]["data"]


class ChartNginx:
    """The chart's three nginx files, paths moved from the pod's (/etc/nginx, /tmp, /shards, :8080) to here."""

    def __init__(self, data: dict[str, str], shards: Path, state: Path):
        self.port = free_port()
        self.state = state
        moves = {
            "/etc/nginx/": f"{state}/",
            "/tmp/": f"{state}/",
            "root /shards;": f"root {shards};",
            "listen 8080;": f"listen 127.0.0.1:{self.port};",
            "error_log /dev/stderr": f"error_log {state}/error.log",
        }
        pattern = re.compile("|".join(map(re.escape, moves)))
        files = {"nginx.conf": "nginx.conf", "default.conf": "conf.d/default.conf"}
        files["shard-server.conf"] = "imagenet-train/shard-server.conf"
        for key, path in files.items():
            text = pattern.sub(lambda found: moves[found.group()], data[key])  # one pass: no move moves again
            directives = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
            assert not re.search(r"/etc/nginx|listen 8080|root /shards|/dev/stderr", directives), directives
            (state / path).parent.mkdir(parents=True, exist_ok=True)
            (state / path).write_text(text)
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> str:
        command = [nginx_binary(), "-p", str(self.state), "-c", str(self.state / "nginx.conf")]
        self.process = subprocess.Popen([*command, "-g", "daemon off;"], stderr=subprocess.PIPE)
        base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the chart's nginx did not start: {self.process.stderr.read().decode()[-2000:]}")
            try:
                if _answer(f"{base}/healthz") == (200, b"ok\n"):
                    return base
            except OSError:
                time.sleep(0.05)
        pytest.fail("the chart's nginx did not answer /healthz within 10 s")

    def __exit__(self, *exc) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait(timeout=10)


@pytest.fixture
def chart_nginx(request, planted, tmp_path) -> Iterator[str]:
    """A real nginx on 127.0.0.1 run from the chart's rendered ConfigMap, serving `planted`."""
    state = tmp_path / "state"
    state.mkdir()
    with ChartNginx(_chart_config_map(request.param), planted, state) as base:
        yield base


@pytest.mark.parametrize("chart_nginx", ["helm", "helm3"], indirect=True)
def test_the_charts_rendered_nginx_answers_404_for_dot_names(chart_nginx):
    _assert_no_dot_name_is_served(chart_nginx)


@pytest.mark.parametrize("helm", ["helm", "helm3"])
def test_the_charts_rendered_nginx_conf_carries_the_dot_name_rule(helm):
    data = _chart_config_map(helm)
    assert "location ~ /\\. {\n    return 404;\n}" in data["shard-server.conf"]
    assert data["shard-server.conf"] == (ROOT / "images" / "shard-server" / "nginx.conf").read_text()
