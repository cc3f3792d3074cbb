"""The loaders from a notebook (executed for real with nbclient) and from a script without a `__main__` guard."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import REPO

SCRIPT = """
from imagenet_train.datasets.source import resolve_source
from imagenet_train.loading.presets import TrainPreset
from imagenet_train.loading.stream import EpochLoader, ShardStream

source = resolve_source({shards!r}, "", "", 0, 0, 3)
stream = ShardStream(source.train_urls, TrainPreset(32, 0.5, False, "simplejpeg").build(), 32, resampled=True)
print("samples", sum(len(labels) for _, labels, _ in EpochLoader(stream, 2, 5)))
"""


def test_a_script_without_a_main_guard_reads_batches_with_worker_processes(digit_shards, tmp_path):
    script = tmp_path / "top_level_loader.py"
    script.write_text(SCRIPT.format(shards=str(digit_shards)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == "samples 160"


@pytest.mark.launchers  # trains for minutes: with the other ways to run, in `make launchers`
def test_the_example_notebook_plans_trains_and_reports_on_the_demo_shards(shard_server, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    monkeypatch.setenv("IMAGENET_TRAIN_SHARDS", f"{shard_server.url}/shards.json")
    monkeypatch.setenv("IMAGENET_TRAIN_RUN_DIR", str(run_dir))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    notebook = nbformat.read(REPO / "examples" / "plan_and_train.ipynb", as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}})
    client.execute()  # raises CellExecutionError naming the cell if any cell fails
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])]
    text = "".join(output.get("text", "") for output in outputs)
    assert "mode resampled" in text and "mode split" in text, text  # the planner's view of both modes
    assert "epoch 1: top-1" in text, text
    assert any("image/png" in output.get("data", {}) for output in outputs)  # the report's overview, shown inline
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run_dir / "report" / "overview.png").is_file()
