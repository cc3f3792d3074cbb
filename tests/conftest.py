"""Shared fixtures: small real datasets built in temp dirs, a real nginx, and a torchrun runner."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import imagebuild
import numpy as np
import pytest
from local_server import serving
from PIL import Image

from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.datasets.digits import write_digits
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.ops.serve import NginxServer

REPO = Path(__file__).resolve().parents[1]
# A small, quick training configuration for the digits; later options override these (argparse: last wins).
SMALL_TRAIN = [
    "--arch",
    "resnet18",
    "--image-size",
    "32",
    "--val-resize",
    "32",
    "--val-crop-size",
    "32",
    "--batch-size",
    "32",
    "--workers",
    "2",
    "--no-hflip",
    "--shuffle-buffer",
    "200",
]
# SMALL_TRAIN for one epoch with a checkpoint every 4 steps (the mid-epoch marker resume and fault tests wait
# for); each test adds --shards, --mode, --run-dir.
CHECKPOINTING_TRAIN = [
    *SMALL_TRAIN,
    *("--batch-size", "16", "--shuffle-buffer", "100", "--checkpoint-every", "4"),
    *("--epochs", "1", "--eval-every", "5"),
]


def jpeg_bytes(seed: int = 0, size: tuple[int, int] = (40, 30), mode: str = "RGB", fmt: str = "JPEG") -> bytes:
    """A small random-noise image encoded in memory."""
    rng = np.random.default_rng(seed)
    array = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(array, "RGB").convert(mode)
    out = io.BytesIO()
    image.save(out, fmt, quality=90)
    return out.getvalue()


def write_image_folder(root: Path, classes: dict[str, int], val: dict[str, int] | None = None, seed: int = 0) -> dict:
    """`root/train/<wnid>/<wnid>_<i>.JPEG` (and val) with distinct images; returns {relative path: bytes}."""
    files = {}
    counter = seed
    for split, spec in (("train", classes), ("val", val or {})):
        for wnid, count in spec.items():
            folder = root / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                counter += 1
                name = f"{wnid}_{i}.JPEG" if split == "train" else f"ILSVRC2012_val_{counter:08d}.JPEG"
                data = jpeg_bytes(counter)
                (folder / name).write_bytes(data)
                files[f"{split}/{wnid}/{name}"] = data
    return files


def write_shard(path: Path, samples: Mapping[str, Mapping[str, bytes]]) -> int:
    """A WebDataset shard at `path`: each sample's members as KEY.EXT, in order; returns its size in bytes."""
    with tarfile.open(path, "w") as archive:
        for key, members in samples.items():
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return path.stat().st_size


def labelled_jpegs(labels: Sequence[bytes], key: str = "{:06d}") -> dict[str, dict[str, bytes]]:
    """Samples of one small JPEG each (jpeg_bytes of its position) with the .cls of `labels`, keyed `key`.format(n)."""
    return {key.format(number): {"jpg": jpeg_bytes(number), "cls": label} for number, label in enumerate(labels)}


def write_index(folder: Path, shards: list[dict], padding: int = 0) -> Path:
    """An imagenet-train index, folder/shards.json, listing `shards` as its train split (and `padding` trailing
    spaces)."""
    document = {
        "__kind__": "wids-shard-index-v1",
        "splits": {"train": {"shardlist": shards, "nsamples": sum(s.get("nsamples", 0) for s in shards)}},
        "classes": ["a", "b"],
    }
    path = folder / "shards.json"
    with open(path, "w") as stream:
        json.dump(document, stream)
        stream.write(" " * padding)
    return path


@pytest.hookimpl(tryfirst=True)  # before pytest's own tmp_path set-up reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    """Run as root, `serve` hands nginx's workers to `nobody` (ops/serve.py), who cannot enter pytest's private
    (0700) temp tree. Then this session's tree is a fresh one of its own that anyone may enter but not list,
    and its test folders are readable, so a folder served by nginx is readable by its workers as on a normal
    machine. A --basetemp given (`make faults`) is kept, and made enterable the same way."""
    if os.geteuid() != 0:
        return
    if config.option.basetemp is None:
        top = Path(tempfile.mkdtemp(prefix="imagenet-train-tests-"))
        top.chmod(0o711)
        config.option.basetemp = str(top / "t")
        config.add_cleanup(lambda: shutil.rmtree(top, ignore_errors=True))
    private = pytest.TempPathFactory.mktemp

    def enterable(self: pytest.TempPathFactory, basename: str, numbered: bool = True) -> Path:
        path = private(self, basename, numbered)
        self.getbasetemp().chmod(0o711)
        path.chmod(0o755)
        return path

    pytest.TempPathFactory.mktemp = enterable


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test is `unit` (marked so: pure code, no processes, milliseconds) or else `integration`
    (torchrun, nginx, helm, podman, emulators, DataLoader workers): `pytest -m unit` is the quick loop. A test
    marked `cuda` is skipped where torch sees no CUDA device."""
    for item in items:
        if item.get_closest_marker("unit") is None:
            item.add_marker(pytest.mark.integration)
    cuda = [item for item in items if item.get_closest_marker("cuda") is not None]
    if cuda:
        import torch

        if not torch.cuda.is_available():  # CI: skipped, saying why; `make gpu-check` runs them on a GPU
            for item in cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU (make gpu-check runs it)"))


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory) -> Path:
    """The demo's real-image dataset (scikit-learn digits) at 32 px, ImageNet layout."""
    root = tmp_path_factory.mktemp("digits")
    write_digits(root, size=32)
    return root


@pytest.fixture(scope="session")
def digit_shards(digits_dir, tmp_path_factory) -> Path:
    """Digits as shards of 130 samples: the last train shard is short (1438 = 11 x 130 + 8)."""
    out = tmp_path_factory.mktemp("digit-shards")
    convert(str(digits_dir), str(out), ShardOptions(maxcount=130), progress=False)
    return out


@pytest.fixture(scope="session")
def shard_server(digit_shards):
    """A real nginx on 127.0.0.1 serving the digit shards."""
    with NginxServer(str(digit_shards)) as server:
        yield server


@pytest.fixture(scope="session")
def training_image(tmp_path_factory) -> Iterator[imagebuild.BuiltImage]:
    """The training image built for real (`make build` on the stand-in base, tests/imagebuild.py), once per
    session for the image test and the end-to-end run; removed at the end."""
    reason = imagebuild.missing_tools()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("image")
    built = imagebuild.build_training_image(imagebuild.Podman(tmp), tmp)
    yield built
    imagebuild.remove_training_image(built.engine)


def child_pids(pid: int) -> list[int]:
    """The direct children of a process (torchrun's ranks), oldest pid first."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


needs_pid_namespace = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="a PID namespace needs root and util-linux's unshare"
)


def as_pid_1(script: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run a Python `script` as pid 1 of a new PID namespace, as a rank is in an image without an init."""
    command = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def torchrun(args: list[str], nproc: int = 2, timeout: float = 240) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=N imagenet-train train ...`; a hang becomes a test failure."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "imagenet_train.cli",
        "train",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # A session of its own, so a hang is ended with every rank and DataLoader worker, not just torchrun.
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"torchrun did not finish within {timeout}s (hang?):\n{stderr[-5000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the `imagenet-train` console script."""
    executable = Path(sys.executable).with_name("imagenet-train")
    return subprocess.run([str(executable), *args], capture_output=True, text=True, timeout=timeout)


# An epoch of about a minute with SMALL_TRAIN on this machine (the digits' own is 22 steps, a few seconds):
# a stop signal sent once a few steps show then reaches the ranks inside it, through ssh or Slurm too.
LONG_EPOCH = ["--epoch-batches", "300"]


def inside_first_epoch(output: str) -> bool:
    """Whether rank 0's progress bar shows a few steps of the first epoch done and more to come, so a stop now
    has a position inside the epoch to save. tqdm redraws at most every 0.1 s, so any count may be skipped."""
    shown = re.findall(r"epoch 0: .*?\| *(\d+)/(\d+) \[", output)
    return any(2 <= int(done) < int(total) for done, total in shown)


@contextlib.contextmanager
def gcs_emulator(bucket: str, host: str = "127.0.0.1") -> Iterator[str]:
    """gcp-storage-emulator in memory on a free port of `host`, with `bucket` made; yields its URL,
    which STORAGE_EMULATOR_HOST points this process and the CLIs it starts at."""
    from imagenet_train.io import gcs
    from imagenet_train.ops.serve import free_port

    port = free_port(host)
    url = f"http://{host}:{port}"
    executable = str(Path(sys.executable).with_name("gcp-storage-emulator"))
    command = [executable, "start", "--host", host, "--port", str(port), "--in-memory"]
    with local_service([*command, "--default-bucket", bucket], f"{url}/storage/v1/b", {"STORAGE_EMULATOR_HOST": url}):
        gcs.client.cache_clear()  # its client was made for the previous endpoint
        try:
            yield url
        finally:
            gcs.client.cache_clear()


@contextlib.contextmanager
def local_service(command: list[str], probe_url: str, environment: dict[str, str]) -> Iterator[None]:
    """Run a real server process (an emulator) on loopback until `probe_url` answers (tools/local_server.py), with
    `environment` set for the test; stop it and restore the environment afterwards."""
    previous = {key: os.environ.get(key) for key in environment}
    with serving(command, probe_url, 30):
        os.environ.update(environment)
        try:
            yield
        finally:
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def refusal(call) -> str:
    """The one-line ImagenetTrainError `call` raises (a bad setting's refusal), asserted to be one line."""
    with pytest.raises(ImagenetTrainError) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message
    return message
