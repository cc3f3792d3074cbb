"""`make gpu-check` (bench/gpu_check.py): without CUDA it exits 0 naming what it skipped; its step runner
trains, stops on SIGTERM, resumes and evaluates through the real CLI on the CPU, and writes its own page section."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "bench" / "gpu_check.py"
CHECKS = [
    "amp-bf16-channels-last",
    "ema",
    "mixup-cutmix",
    "progressive-simplejpeg",
    "progressive-dali",
    "compile-progressive",
    "val-tta",
    "sigterm-resume",
    "evaluate",
]


def gpu_check(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_without_cuda_it_exits_0_and_names_everything_it_skipped(tmp_path):
    page = tmp_path / "benchmarks.md"
    result = gpu_check("--out", str(page), "--workdir", str(tmp_path / "work"))
    assert result.returncode == 0, result.stderr
    assert "no CUDA device here; skipped:" in result.stdout
    parts = ["pytest -m cuda", "P6 (bench/gpu.py) at 160, 192, 224 px", "bench/gpu_step.py", "Fashion-MNIST"]
    for name in [*CHECKS, *parts]:
        assert name in result.stdout
    assert not page.exists() and not (tmp_path / "work").exists()  # nothing measured, nothing written


def test_its_step_runner_stops_on_sigterm_resumes_and_evaluates_on_cpu(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\nintro\n\n## Someone else's section\n\nkept\n")
    work = tmp_path / "work"
    result = gpu_check(
        *("--device", "cpu", "--checks", "sigterm-resume", "evaluate", "--steps", "9", "--batch-size", "4"),
        *("--short-side", "48", "--crop", "32", "--workers", "1", "--no-p6", "--no-tests", "--no-step", "--no-tta"),
        *("--out", str(page), "--workdir", str(work)),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    checks = json.loads((work / "results.json").read_text())["checks"]
    stopped = checks["sigterm-resume"]
    assert stopped["ok"] and stopped["crop_sizes"] == [32, 32, 32]
    assert stopped["stopped_at"].startswith("epoch 0 step ")  # inside the first epoch, not at its end
    evaluated = checks["evaluate"]
    assert evaluated["ok"] and evaluated["top1"] == evaluated["top1_in_training"]  # on the CPU, to the bit
    assert evaluated["val_loss"] == evaluated["val_loss_in_training"]
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n") and "## Someone else's section\n\nkept\n" in text
    assert "## make gpu-check" in text and "| sigterm-resume | passed |" in text and "| evaluate | passed |" in text
    assert "CPU only (--device cpu)" in text
    left_out = [name for name in CHECKS if name not in ("sigterm-resume", "evaluate")]
    assert f"Left out by `--checks`, so not measured here: {', '.join(left_out)}." in text


def script_module():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check as script
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return script


def test_evaluate_may_differ_from_training_by_a_near_tie_flipped_under_bf16_and_no_more():
    """On an H100 `imagenet-train evaluate` scored one val image of 128 otherwise than training had (bf16, each
    process its own cudnn kernels); a wrong crop or weights file moves the loss, and more than a tie or two."""
    same_scores = script_module().same_scores
    trained = {"top1": 0.2421875, "val_loss": 1.8305}
    assert same_scores({"top1": 0.2421875, "val_loss": 1.8305, "val_samples": 128}, trained)
    assert same_scores({"top1": 0.234375, "val_loss": 1.8311, "val_samples": 128}, trained)  # one image flipped
    assert not same_scores({"top1": 0.2421875, "val_loss": 1.9, "val_samples": 128}, trained)  # 4 % off
    assert not same_scores({"top1": 0.21875, "val_loss": 1.8305, "val_samples": 128}, trained)  # 3 images
    assert same_scores({"top1": 0.5, "val_loss": 1.0, "val_samples": 50_000}, {"top1": 0.5008, "val_loss": 1.0})
    assert not same_scores({"top1": 0.2421875, "val_samples": 128}, trained)  # no loss: not compared, a failure


def test_the_cuda_tests_collected_from_the_modules_that_mark_one_are_every_cuda_test_of_the_suite():
    """gpu_check collects only the modules that mark a `cuda` test (a GPU machine set up for training need not
    have every test's dependencies, such as moto or the emulators), and misses none of the suite's."""
    script = script_module()

    def cuda_ids(*paths: str) -> set[str]:
        command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "cuda"]
        listed = subprocess.run([*command, *paths], capture_output=True, text=True, cwd=REPO, timeout=300).stdout
        return {line for line in listed.splitlines() if "::" in line}

    files = script.cuda_test_files()
    assert 0 < len(files) < len(list((REPO / "tests").rglob("test_*.py")))
    whole = cuda_ids("tests")
    assert whole and cuda_ids(*files) == whole


def test_the_step_table_compares_each_variant_with_eager_and_says_what_was_skipped():
    script = script_module()
    eager = {"variant": "eager", "title": "eager", "batch": 256, "losses": [7.0, 6.9] + [6.5] * 38}
    eager |= {"fixed": {"img_s": 5000.0, "sync_check": "passed"}, "shards": {"img_s": 4000.0, "data_wait": 0.01}}
    graphs = {"variant": "cudagraphs", "title": "graphs", "batch": 256, "losses": [7.0, 6.95] + [6.5] * 38}
    graphs |= {"fixed": {"img_s": 7000.0, "sync_check": "passed"}, "shards": {"img_s": 6000.0, "data_wait": 0.02}}
    skipped = {"variant": "autotune", "skipped": "past --budget-s 240"}
    lines = script.step_section({"variants": [eager, graphs, skipped]})
    assert "loss at steps 1, 10, 20, 40" in lines[1]
    assert lines[4].startswith("| graphs | 256 | 7000.0 | 6000.0 | 0.02 | 1.50x |") and lines[4].endswith("| 0.0500 |")
    assert lines[5] == "| autotune | skipped: past --budget-s 240 |  |  |  |  |  |  |  |  |"
    assert script.step_section(None) == [] and script.tta_section(None) == []
    assert "**failed**: nginx" in script.tta_section({"ok": False, "error": "nginx: not installed"})[1]
