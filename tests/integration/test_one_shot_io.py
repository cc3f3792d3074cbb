"""One-shot commands (plan, summarize, evaluate) against a shard server that is gone: one line naming the URL and
--io-timeout, exit 2, within a short budget of their own, not training's 900 s that rides out a pod's move."""

from __future__ import annotations

import functools
import http.server
import threading
import time
from pathlib import Path

import pytest
import torch

from imagenet_train.config import Config
from imagenet_train.limits import ONE_SHOT_IO_TIMEOUT
from imagenet_train.ops.serve import free_port
from imagenet_train.training import models

from conftest import cli

# evaluate's model and val crops as the digits take them (flags win over a run's config.json)
EVALUATE = ["--arch", "resnet18", "--val-resize", "32", "--val-crop-size", "32", "--batch-size", "32", "--workers", "1"]
# Start-up of a command on a loaded 2-core machine (torch's import: seconds), on top of the budget.
START_UP_S = 60


def dead_index() -> str:
    """An index URL on a port that nothing listens on."""
    return f"http://127.0.0.1:{free_port()}/shards.json"


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """A resnet18 state dict for the digits' 10 classes (evaluate reads it before it reaches for the shards)."""
    cfg = Config()
    cfg.run.arch = "resnet18"
    path = tmp_path_factory.mktemp("weights") / "weights.pt"
    torch.save(models.create(cfg.run, 10, False).state_dict(), path)
    return path


def run_config(folder: Path, url: str) -> Path:
    """A run's config.json as `train` writes it, whose shards are at `url` and whose budget is training's 900 s."""
    cfg = Config()
    cfg.data.shards, cfg.run.run_dir = url, str(folder / "run")
    path = folder / "config.json"
    path.write_text(cfg.to_json())
    assert cfg.loader.io_timeout == 900
    return path


class IndexThenGone:
    """A shard server that answers the index once and then stops listening (a server stopped mid-way)."""

    def __init__(self, root: Path) -> None:
        handler = functools.partial(_IndexOnce, directory=str(root), owner=self)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/shards.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        threading.Thread(target=self._close, daemon=True).start()

    def _close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _IndexOnce(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, owner: IndexThenGone, **kwargs):
        self.owner = owner
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        super().do_GET()
        self.owner.stop()  # whatever came first (the index): nothing answers after it

    def log_message(self, *_) -> None:
        pass


def assert_fails_fast(result, took: float, url: str, budget: float) -> None:
    """Exit 2 within the budget (plus start-up), ending in one line naming the URL and the flag, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("imagenet-train: error: ") and url in last, last
    assert f"--io-timeout {budget:g} s" in last, last
    assert took < budget + START_UP_S, took


def one_shot(weights: Path, folder: Path, url: str) -> dict[str, list[str]]:
    """Each one-shot command reaching for the index at `url` (evaluate through a run's config.json, as README)."""
    return {
        "plan": ["plan", "--shards", url],
        "summarize": ["summarize", url],
        "evaluate": ["evaluate", str(weights), "--config", str(run_config(folder, url)), *EVALUATE, "--out", "-"],
    }


@pytest.mark.parametrize("command", ["plan", "summarize", "evaluate"])
def test_a_one_shot_command_takes_io_timeout_and_gives_up_on_a_dead_port_in_one_line(command, weights, tmp_path):
    url = dead_index()
    started = time.monotonic()
    result = cli(*one_shot(weights, tmp_path, url)[command], "--io-timeout", "2", timeout=300)
    assert_fails_fast(result, time.monotonic() - started, url, 2)


def test_evaluate_against_a_server_stopped_after_the_index_gives_up_in_one_line(digit_shards, weights, tmp_path):
    server = IndexThenGone(digit_shards)
    started = time.monotonic()
    result = cli(*one_shot(weights, tmp_path, server.url)["evaluate"], "--io-timeout", "2", timeout=300)
    assert_fails_fast(result, time.monotonic() - started, server.url.removesuffix("shards.json"), 2)
    assert "shards.json" not in result.stderr.strip().splitlines()[-1]  # the index was read; a shard was not


@pytest.mark.slow
@pytest.mark.parametrize("command", ["plan", "summarize", "evaluate"])
def test_a_one_shot_command_gives_up_on_a_dead_port_within_its_own_default_budget(command, weights, tmp_path):
    """Without --io-timeout: the one-shot budget, whatever a run's config.json says (README's evaluate line on a
    demo run whose server is gone waited 15 minutes on abc5a5b)."""
    url = dead_index()
    started = time.monotonic()
    result = cli(*one_shot(weights, tmp_path, url)[command], timeout=ONE_SHOT_IO_TIMEOUT + 2 * START_UP_S)
    assert_fails_fast(result, time.monotonic() - started, url, ONE_SHOT_IO_TIMEOUT)
