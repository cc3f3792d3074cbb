"""`make gpu-check`: on a machine with one CUDA GPU, in under 10 minutes, every CUDA test, a few hundred training
steps of each mechanism through the real CLI, and P6 at 160, 192 and 224 px; the figures go into their own section
of docs/benchmarks.md. Without CUDA it exits 0 and says what it skipped.

  python bench/gpu_check.py                                   # what `make gpu-check` runs
  python bench/gpu_check.py --device cpu --checks ema --steps 6 --short-side 64 --batch-size 4 --no-p6 --no-tests
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import pages  # noqa: E402

HEADING = "## make gpu-check"
REPO = Path(__file__).resolve().parents[1]
P6_SIZES = (160, 192, 224)
STEP_VARIANTS = ["eager", "fused", "compile", "cudagraphs"]  # bench/gpu_step.py's (its VARIANTS), in its order
TIMEOUT_S = 300  # one training run; the whole check aims at 10 minutes
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"  # dataset-fashion-mnist's idx files


@dataclasses.dataclass(frozen=True)
class Check:
    """One mechanism: what it exercises and the train flags that turn it on."""

    title: str
    flags: tuple[str, ...] = ()
    ramp: bool = False  # progressive resizing over the run's 3 epochs


CHECKS = {
    "amp-bf16-channels-last": Check("bf16 AMP and channels_last", ("--amp", "bf16", "--channels-last")),
    "ema": Check("EMA (--model-ema), scored beside the raw weights", ("--model-ema", "--model-ema-steps", "4")),
    "mixup-cutmix": Check("MixUp and CutMix on the GPU batch", ("--mixup-alpha", "0.2", "--cutmix-alpha", "1.0")),
    "progressive-simplejpeg": Check("progressive resizing, simplejpeg decode", ("--decoder", "simplejpeg"), True),
    "progressive-dali": Check(
        "progressive resizing, DALI decode (rebuilt on a size change)", ("--decoder", "dali"), True
    ),
    "compile-progressive": Check("--compile with progressive resizing (compiles counted)", ("--compile",), True),
    "val-tta": Check("--val-tta (test-time flip)", ("--val-tta",)),
    "sigterm-resume": Check("SIGTERM mid-epoch, then --resume latest"),
    "evaluate": Check("`imagenet-train evaluate` of the resumed run's final.pt"),
}


def shards(work: Path, images: int, val_images: int, short_side: int | None) -> Path:
    """ImageNet-like JPEG shards (train and val), made once under `work`."""
    from imagenet_train.datasets.convert import ShardOptions, convert

    out = work / f"shards-{images}-{val_images}-{short_side or 'full'}"
    if (out / "shards.json").exists():
        return out
    sides = (short_side, short_side) if short_side else None
    folder = common.imagenet_like(work / f"jpegs-{images}-{short_side or 'full'}", images, short_sides=sides)
    val = common.imagenet_like(work / f"val-{val_images}-{short_side or 'full'}", val_images, seed=1, short_sides=sides)
    both = work / "both"
    shutil.rmtree(both, ignore_errors=True)
    both.mkdir()
    (both / "train").symlink_to(folder / "train")
    (both / "val").symlink_to(val / "train")
    convert(str(both), str(out), ShardOptions(maxcount=256), progress=False, follow_symlinks=True)
    return out


def train_command(args: argparse.Namespace, data: Path, run_dir: Path, check: Check, *extra: str) -> list[str]:
    """`imagenet-train train` for a check: 3 epochs of `args.steps // 3` batches (one pass over the images each)."""
    ramp = ()
    if check.ramp:
        low, high = args.ramp
        ramp = ("--progressive-start-size", str(low), "--progressive-end-size", str(high))
        ramp += ("--progressive-start-epoch", "0", "--progressive-end-epoch", "2")
    return [
        *(sys.executable, "-m", "imagenet_train.cli", "train", "--shards", str(data), "--run-dir", str(run_dir)),
        *("--arch", args.arch, "--batch-size", str(args.batch_size), "--workers", str(args.workers)),
        *("--epochs", "3", "--train-crop-size", str(args.crop), "--val-resize-size", str(args.crop + args.crop // 7)),
        *("--val-crop-size", str(args.crop), "--no-tensorboard", "--warmup-epochs", "0"),
        *ramp,
        *check.flags,
        *extra,
    ]


def environment(args: argparse.Namespace, **more: str) -> dict[str, str]:
    """The runs' environment: the GPU hidden under --device cpu."""
    env = {**os.environ, **more}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run(command: list[str], env: dict[str, str], timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run a command to its end (or its timeout, a failure), output captured."""
    try:
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        return subprocess.CompletedProcess(command, -1, "", f"timed out after {timeout:.0f} s: {expired.stderr!r}")


def metrics(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl lines."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def failure(process: subprocess.CompletedProcess, what: str) -> dict:
    """A failed step's record: its exit status and the last line it wrote."""
    lines = [line for line in (process.stderr + process.stdout).splitlines() if line.strip()]
    return {"ok": False, "error": f"{what}: exit {process.returncode}: {lines[-1][:300] if lines else ''}"}


def summary(lines: list[dict], seconds: float) -> dict:
    """A finished run's figures: its last epoch's loss, top-1, rate and the crop size of every epoch."""
    if not lines:
        return {"ok": False, "error": "the run wrote no metrics.jsonl line", "seconds": round(seconds, 1)}
    last = lines[-1]
    return {
        "ok": len(lines) == 3,
        "seconds": round(seconds, 1),
        "train_loss": round(last.get("train_loss", float("nan")), 4),
        "top1": last.get("top1"),
        "ema_top1": last.get("ema_top1"),
        "img_s": last.get("samples_per_s"),
        "crop_sizes": [line.get("train_crop_size") for line in lines],
    }


def train_check(args: argparse.Namespace, data: Path, name: str) -> dict:
    """Train one mechanism's run to its end; its figures, or what failed."""
    run_dir, check = args.workdir / "runs" / name, CHECKS[name]
    shutil.rmtree(run_dir, ignore_errors=True)
    env = environment(args, TORCH_LOGS="recompiles") if "--compile" in check.flags else environment(args)
    started = time.monotonic()
    process = run(train_command(args, data, run_dir, check), env)
    if process.returncode != 0:
        return failure(process, "train")
    result = summary(metrics(run_dir), time.monotonic() - started)
    if "--compile" in check.flags:  # the first compile, then one recompile for each new size (TORCH_LOGS)
        result["compiles"] = 1 + process.stderr.count("Recompiling function")
        result["ok"] = result["ok"] and result["compiles"] <= len(set(result["crop_sizes"]))
    return result


def sigterm_resume(args: argparse.Namespace, data: Path) -> dict:
    """Stop a run with SIGTERM once its first mid-epoch checkpoint is written, then finish it with --resume latest."""
    run_dir, check = args.workdir / "runs" / "sigterm-resume", CHECKS["sigterm-resume"]
    shutil.rmtree(run_dir, ignore_errors=True)
    every = str(max(1, args.steps // 12))  # a mid-epoch checkpoint a quarter into the first epoch: then the signal
    command, env = train_command(args, data, run_dir, check, "--checkpoint-every", every), environment(args)
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    checkpoints = run_dir / "checkpoints"
    while process.poll() is None and time.monotonic() - started < TIMEOUT_S:
        if any(checkpoints.glob("epoch-0000-step-*.pt")):
            process.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    stopped = re.search(r"stopped by SIGTERM at epoch (\d+) step (\d+)", output)
    if process.returncode != 128 + signal.SIGTERM or not stopped:
        return failure(subprocess.CompletedProcess(command, process.returncode, output, ""), "SIGTERM stop")
    resumed = run([*command, "--resume", "latest"], env)
    if resumed.returncode != 0:
        return failure(resumed, "resume")
    result = summary(metrics(run_dir), time.monotonic() - started)
    result["stopped_at"] = f"epoch {stopped[1]} step {stopped[2]}"
    result["ok"] = result["ok"] and "resumed from" in resumed.stdout
    return result


def same_scores(evaluated: dict, trained: dict) -> bool:
    """Whether `imagenet-train evaluate` scored the weights as training did: under bf16 on a GPU each process
    picks its own convolution kernels (cudnn.benchmark), whose rounding can flip a near tie, so top-1 may move
    by a sample or two (1 of 128 on an H100) and the loss by far less than 1 %; a wrong crop, normalisation or
    weights file moves the loss by more."""
    top1, loss, samples = evaluated.get("top1"), evaluated.get("val_loss"), evaluated.get("val_samples")
    if None in (top1, loss, samples, trained.get("top1"), trained.get("val_loss")) or not samples:
        return False
    flips = abs(top1 - trained["top1"]) * samples
    return flips <= max(2, samples // 100) + 1e-6 and abs(loss - trained["val_loss"]) <= 0.01 * trained["val_loss"]


def evaluate_check(args: argparse.Namespace, data: Path) -> dict:
    """`imagenet-train evaluate` of the resumed run's final.pt: its scores must be the ones training measured
    (`same_scores`)."""
    run_dir = args.workdir / "runs" / "sigterm-resume"
    if not (run_dir / "final.pt").exists():
        return {"ok": False, "error": "no final.pt: the sigterm-resume check did not finish"}
    out, started = args.workdir / "evaluate.json", time.monotonic()
    command = [
        *(sys.executable, "-m", "imagenet_train.cli", "evaluate", str(run_dir / "final.pt"), "--shards", str(data)),
        *("--config", str(run_dir / "config.json"), "--workers", str(args.workers), "--out", str(out)),
    ]
    process = run(command, environment(args))
    if process.returncode != 0:
        return failure(process, "evaluate")
    report = json.loads(out.read_text())
    trained = metrics(run_dir)[-1]
    if trained.get("final_weights") == "ema":
        trained = {key[len("ema_") :]: value for key, value in trained.items() if key.startswith("ema_")}
    return {
        "ok": same_scores(report, trained),
        "seconds": round(time.monotonic() - started, 1),
        "top1": report.get("top1"),
        "top1_in_training": trained.get("top1"),
        "val_loss": report.get("val_loss"),
        "val_loss_in_training": trained.get("val_loss"),
    }


def cuda_test_files() -> list[str]:
    """The test modules that mark a test `cuda`. Collecting the whole suite would import every test's own
    dependencies (moto, the emulators, Helm's tools), which a GPU machine set up for training need not have."""
    return sorted(str(path) for path in (REPO / "tests").rglob("test_*.py") if "pytest.mark.cuda" in path.read_text())


def cuda_tests(args: argparse.Namespace) -> dict:
    """Every test marked `cuda`, on this GPU."""
    started = time.monotonic()
    process = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", *cuda_test_files()],
        os.environ,
        600,
    )
    tail = [line for line in process.stdout.splitlines() if line.strip()][-1:] or [""]
    return {"ok": process.returncode == 0, "seconds": round(time.monotonic() - started, 1), "pytest": tail[0][:200]}


def p6(args: argparse.Namespace, data: Path) -> dict:
    """bench/gpu.py at each P6 size: the trainer's ResNet-50 step on a fixed GPU batch and on the shards."""
    found = {}
    for size in P6_SIZES:
        command = [sys.executable, str(Path(__file__).with_name("gpu.py")), "--shards", str(data), "--synthetic"]
        command += ["--crop-size", str(size), "--workers", str(args.workers), "--steps", "100", "--warmup", "15"]
        process = run(command, environment(args))
        lines = [line for line in process.stdout.splitlines() if line.startswith("{")]
        found[size] = json.loads(lines[-1]) if process.returncode == 0 and lines else failure(process, "bench/gpu.py")
    return found


def step_variants(args: argparse.Namespace, data: Path) -> dict:
    """bench/gpu_step.py: P6's step eager, with fused SGD, compiled and as a CUDA graph, with their loss curves."""
    out = args.workdir / "step.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).with_name("gpu_step.py")), "--shards", str(data), "--out", str(out)]
    command += ["--workers", str(args.workers), "--budget-s", str(args.step_budget_s), "--variants", *args.variants]
    process = run(command, environment(args), timeout=args.step_budget_s + 300)
    found = json.loads(out.read_text()) if out.exists() else {"variants": []}
    if process.returncode != 0:
        found["error"] = failure(process, "bench/gpu_step.py")["error"]
    return found


def time_to_accuracy(args: argparse.Namespace) -> dict:
    """Fashion-MNIST's 60,000 train images through the whole path: written as JPEGs and sharded (timed), served by
    nginx, trained by torchrun (one process on this GPU) with recipes/small-images.yaml; top-1 on the test set."""
    from mechanisms import RECIPE, train
    from small_images import data as fashion_shards

    from imagenet_train.config_files import load_settings
    from imagenet_train.ops.serve import NginxServer

    work = args.tta_workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    shards = fashion_shards(work, str(args.fashion_mnist), args.tta_train_size)
    prepared = time.monotonic() - started
    for folder in (shards, *shards.rglob("*")):  # nginx started as root serves as `nobody`: the shards only
        folder.chmod(0o755 if folder.is_dir() else 0o644)
    epochs = load_settings(RECIPE)["epochs"]
    options = argparse.Namespace(nproc=1, recipe=str(RECIPE), epochs=epochs, extra=["--workers", str(args.workers)])
    run_dir = work / "runs" / f"seed0-{int(time.time())}"
    with NginxServer(str(shards)) as server:
        ran = train(f"{server.url}/shards.json", run_dir, options, 0, [])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "ok": len(records) == epochs,
        "epochs": epochs,
        "train_images": args.tta_train_size or 60_000,
        "prepare_s": round(prepared, 1),
        "training_s": round(sum(record["epoch_time_s"] for record in records), 1),
        "run_s": ran["seconds"],
        "top1_by_epoch": [record.get("top1") for record in records],
        "top1": ran["top1"],
        "device": args.device,
        "seconds": round(time.monotonic() - started, 1),
    }


def guarded(part: Callable[[argparse.Namespace], dict], args: argparse.Namespace) -> dict:
    """A part's figures, or its one-line failure: the parts after it still run."""
    try:
        return part(args)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - any failure is this part's row, not the check's end
        return {
            "ok": False,
            "error": f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}",
        }


def skipped_without_cuda() -> list[str]:
    """What the check would have run, for the message on a machine without CUDA."""
    return ["the CUDA tests (pytest -m cuda)", *(f"{name}: {check.title}" for name, check in CHECKS.items())] + [
        f"P6 (bench/gpu.py) at {', '.join(map(str, P6_SIZES))} px",
        "the step variants (bench/gpu_step.py): eager, fused SGD, compiled, CUDA graphs, with their loss curves",
        "time to accuracy: Fashion-MNIST through shards, nginx and training with recipes/small-images.yaml",
    ]


def gpu_name(device: str) -> str:
    """The GPU's name, or the CPU's under --device cpu."""
    import torch

    if device == "cuda":
        return f"{torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory >> 30} GiB)"
    return "CPU only (--device cpu)"


def section(report: dict) -> list[str]:
    """The page's section: the command, the machine, each check's figures and P6's."""
    left_out = report.get("left_out", [])
    unmeasured = f" Left out by `--checks`, so not measured here: {', '.join(left_out)}." if left_out else ""
    lines = [
        HEADING,
        "",
        f"Measured {report['date']} by `{report['command']}` in {report['seconds']:.0f} s on {report['gpu']}, "
        f"host {report['machine']}, torch {report['torch']}, at {report['revision']}. Each check trains "
        f"{report['arch']} through the real CLI for 3 epochs of {report['steps'] // 3} batches of "
        f"{report['batch_size']} ({report['workers']} loader workers); raw figures: `{report['results']}`.{unmeasured}",
        "",
        "| check | result | seconds | last train loss | top-1 | img/s | crop sizes | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, found in report["checks"].items():
        notes = found.get("error") or "; ".join(
            f"{key} {found[key]}"
            for key in ("compiles", "stopped_at", "ema_top1", "top1_in_training", "pytest")
            if found.get(key) is not None
        )
        sizes = ", ".join(map(str, found.get("crop_sizes", [])))
        cells = [name, "passed" if found.get("ok") else "**failed**", found.get("seconds", "")]
        cells += [found.get("train_loss", ""), found.get("top1", ""), found.get("img_s", ""), sizes, notes]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    if report.get("p6"):
        lines += [
            "",
            "| P6 crop | fixed batch on the GPU (img/s) | real shards (img/s) | data wait |",
            "|---|---|---|---|",
        ]
        for size, found in report["p6"].items():
            real = next((value for key, value in found.items() if key.endswith("w") and isinstance(value, dict)), {})
            synthetic = found.get("synthetic", {}).get("img_s", found.get("error", ""))
            shards_rate = real.get("img_s", real.get("error", ""))
            lines.append(f"| {size} px | {synthetic} | {shards_rate} | {real.get('data_wait', '')} |")
    return [*lines, *step_section(report.get("step")), *tta_section(report.get("tta")), ""]


CURVE_POINTS = (0, 9, 19, 39)  # steps of the loss curve shown (0-based); the raw file has every step


def step_section(found: dict | None) -> list[str]:
    """The step variants' rows: img/s on a fixed batch and on the shards, and the loss curve against eager's."""
    if not found:
        return []
    variants = found.get("variants", [])
    eager = next((v for v in variants if v.get("variant") == "eager"), {})
    shown = [point for point in CURVE_POINTS if point < len(eager.get("losses", []))]
    lines = [
        "",
        "| step variant | batch | fixed batch (img/s) | real shards (img/s) | data wait | vs eager | seconds "
        f"| sync check | loss at steps {', '.join(str(point + 1) for point in shown)} | largest loss gap to eager |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(step_row(variant, eager, shown) for variant in variants),
    ]
    return [*lines, "", f"bench/gpu_step.py: {found['error']}"] if found.get("error") else lines


def step_row(variant: dict, eager: dict, shown: list[int]) -> str:
    """One variant's row of the step table."""
    if "skipped" in variant:
        return f"| {variant['variant']} | skipped: {variant['skipped']} |  |  |  |  |  |  |  |  |"
    fixed, real, losses = variant.get("fixed", {}), variant.get("shards", {}), variant.get("losses", [])
    base, reference = eager.get("shards", {}).get("img_s"), eager.get("losses", [])
    ratio = f"{real['img_s'] / base:.2f}x" if base and real.get("img_s") else ""
    gaps = [abs(a - b) for a, b in zip(losses, reference, strict=False)]
    cells = [variant["title"], variant["batch"], fixed.get("img_s", ""), real.get("img_s", "")]
    cells += [real.get("data_wait", ""), ratio, variant.get("seconds", ""), fixed.get("sync_check", "")]
    cells += [" / ".join(f"{losses[point]:.4f}" for point in shown) if losses else ""]
    cells += [f"{max(gaps):.4f}" if gaps else ""]
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def tta_section(found: dict | None) -> list[str]:
    """The time-to-accuracy row: Fashion-MNIST through shards, nginx and training on this GPU."""
    if not found:
        return []
    if "error" in found:
        return ["", f"Time to accuracy (Fashion-MNIST): **failed**: {found['error']}"]
    by_epoch = ", ".join(f"{top1:.4f}" for top1 in found["top1_by_epoch"] if top1 is not None)
    return [
        "",
        "| time to accuracy | JPEGs and shards | training | run (torchrun to exit) | test top-1 | top-1 by epoch |",
        "|---|---|---|---|---|---|",
        f"| Fashion-MNIST, {found['train_images']:,} train images, recipes/small-images.yaml, "
        f"{found['epochs']} epochs, 1 {'GPU' if found.get('device', 'cuda') == 'cuda' else 'CPU process'} | "
        f"{found['prepare_s']} s | {found['training_s']} s | {found['run_s']} s | {found['top1']:.4f} | {by_epoch} |",
    ]


def write_page(out: Path, report: dict) -> None:
    """Replace (or add) this check's section of `out`, keeping every other section."""
    old = out.read_text() if out.exists() else ""
    head = old.split("\n## ", 1)[0].rstrip("\n").splitlines() if old else []
    kept = pages.hand_written(old, [HEADING])
    out.write_text("\n".join([*head, "", *kept, *section(report)]).rstrip("\n") + "\n")


def run_checks(args: argparse.Namespace, data: Path) -> dict[str, dict]:
    """The CUDA tests and each mechanism's check, each printed as it ends."""
    checks: dict[str, dict] = {}
    if not args.no_tests:
        checks["cuda-tests"] = cuda_tests(args)
        print(f"gpu-check: cuda-tests: {json.dumps(checks['cuda-tests'])}", flush=True)
    for name in args.checks:
        print(f"gpu-check: {name}: {CHECKS[name].title}", flush=True)
        if name == "sigterm-resume":
            checks[name] = sigterm_resume(args, data)
        elif name == "evaluate":
            checks[name] = evaluate_check(args, data)
        else:
            checks[name] = train_check(args, data, name)
        print(f"gpu-check: {name}: {json.dumps(checks[name])}", flush=True)
    return checks


def run_parts(args: argparse.Namespace, data: Path, report: dict) -> None:
    """P6, the step variants and the time to accuracy, each printed and saved as it ends: a lease that runs out
    keeps the parts before it."""
    parts: dict[str, Callable[[], dict]] = {
        "p6": lambda: p6(args, data),
        "step": lambda: step_variants(args, data),
        "tta": lambda: guarded(time_to_accuracy, args),
    }
    for part, measured in parts.items():
        if not getattr(args, f"no_{part}"):
            report[part] = measured()
            print(f"gpu-check: {part}: {json.dumps(report[part])}", flush=True)
            (args.workdir / "results.json").write_text(json.dumps(report, indent=1, default=str) + "\n")


def merge(report: dict, earlier: dict) -> None:
    """An earlier run's parts where this one measured none (and, with its checks, what it left out)."""
    if not report["checks"]:
        report["left_out"] = earlier.get("left_out", [])
    for part in ("checks", "p6", "step", "tta"):
        report[part] = report[part] or earlier.get(part)
    report["command"] += f" (with {earlier['command']}'s parts)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: run the checks without a GPU")
    parser.add_argument("--checks", nargs="*", choices=list(CHECKS), default=list(CHECKS))
    parser.add_argument("--steps", type=int, default=240, help="training steps of each check (3 epochs)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)))
    parser.add_argument("--arch", default="resnet18", help="the checks' model (P6 is ResNet-50)")
    parser.add_argument("--crop", type=int, default=176, help="train and val crop without a ramp")
    parser.add_argument("--ramp", type=int, nargs=2, default=(128, 192), help="progressive resizing's start and end")
    parser.add_argument("--short-side", type=int, default=256, help="the JPEGs' short side (0: 500x375)")
    parser.add_argument("--workdir", type=Path, default=Path("bench/.work/gpu-check"))
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"), help="page to write (- : none)")
    parser.add_argument("--no-tests", action="store_true", help="leave out the CUDA tests")
    parser.add_argument("--no-p6", action="store_true", help="leave out P6")
    parser.add_argument("--no-step", action="store_true", help="leave out the step variants (bench/gpu_step.py)")
    parser.add_argument("--variants", nargs="+", default=list(STEP_VARIANTS), choices=STEP_VARIANTS + ["autotune"])
    parser.add_argument("--step-budget-s", type=float, default=240, help="start no step variant after this")
    parser.add_argument("--no-tta", action="store_true", help="leave out the time to accuracy on Fashion-MNIST")
    parser.add_argument("--fashion-mnist", type=Path, default=Path(DEBIAN_FASHION_MNIST), help="its idx files")
    parser.add_argument("--tta-train-size", type=int, default=0, help="train images (0: all 60,000)")
    parser.add_argument("--tta-workdir", type=Path, default=Path("bench/.work/gpu-tta"))
    parser.add_argument("--merge", type=Path, help="a results.json whose parts this run does not measure are kept")
    given = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(given)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA device here; skipped:\n  " + "\n  ".join(skipped_without_cuda()), flush=True)
        return 0
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    images = (args.steps // 3) * args.batch_size  # an epoch is one pass over them, whichever clock a ramp counts
    data = shards(args.workdir, images, 2 * args.batch_size, args.short_side or None)
    checks = run_checks(args, data)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python bench/gpu_check.py", *given]) if given else "make gpu-check",
        "gpu": gpu_name(args.device),
        "machine": common.machine(),
        "torch": torch.__version__,
        "revision": subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True
        ).stdout.strip(),
        **{key: getattr(args, key) for key in ("arch", "steps", "batch_size", "workers")},
        "checks": checks,
        "left_out": [name for name in CHECKS if name not in args.checks],
        "p6": {},
        "step": None,
        "tta": None,
        "results": str(args.workdir / "results.json"),
    }
    run_parts(args, data, report)
    if args.merge and args.merge.exists():
        merge(report, json.loads(args.merge.read_text()))
    report["seconds"] = time.monotonic() - began
    (args.workdir / "results.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    if str(args.out) != "-":
        write_page(args.out, report)
    failed = [name for name, found in checks.items() if not found.get("ok")]
    passed = len(checks) - len(failed)
    failed += [f"P6 at {size} px" for size, found in report["p6"].items() if "error" in found]
    failed += ["step variants"] if (report["step"] or {}).get("error") else []
    failed += ["time to accuracy"] if report["tta"] and not report["tta"].get("ok") else []
    print(
        f"gpu-check: {passed} of {len(checks)} checks passed in {report['seconds']:.0f} s"
        + (f"; failed: {', '.join(failed)}" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
