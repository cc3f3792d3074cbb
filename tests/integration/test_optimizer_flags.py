"""The optimisation flags through the real console script: LARS without timm installed is one line, and `plan`
advises LARS for a large global batch with plain SGD."""

import os
import subprocess
import sys

from conftest import REPO, cli


def test_opt_lars_without_timm_is_one_error_line_with_the_install_command(tmp_path):
    shim = tmp_path / "shim" / "timm"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError(\"No module named 'timm'\")\n")  # timm not installed
    path = os.pathsep.join([str(tmp_path / "shim"), str(REPO / "app")])
    result = subprocess.run(
        [sys.executable, "-m", "imagenet_train.cli", "train", "--opt", "lars", "--shards", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "imagenet-train: error: --opt lars: needs timm (pip install 'imagenet-train[timm]')"
    ]


def test_plan_advises_lars_above_a_global_batch_of_8192_with_sgd_only():
    launch = ["plan", "--nshards", "64", "--samples-per-shard", "1000", "--nodes", "8", "--gpus-per-node", "8"]
    sgd = cli(*launch, "--batch-size", "256")  # 16,384
    assert sgd.returncode == 0, sgd.stderr
    assert "advice: global batch 16384 with plain SGD" in sgd.stdout and "--opt lars" in sgd.stdout
    assert "advice:" not in cli(*launch, "--batch-size", "256", "--opt", "lars").stdout
    assert "advice:" not in cli(*launch, "--batch-size", "128").stdout  # 8,192: Goyal's batch still trains
