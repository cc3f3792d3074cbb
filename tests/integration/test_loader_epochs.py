"""Loaders, driven one virtual rank at a time: exact epochs, resampled lengths, corrupt samples."""

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from imagenet_train.datasets.source import ShardInfo, resolve_source
from imagenet_train.errors import ImagenetTrainError, one_line
from imagenet_train.loading.presets import TrainPreset, ValPreset
from imagenet_train.loading.stages import ShardReading
from imagenet_train.loading.stream import EpochLoader, ShardStream
from imagenet_train.planning import plan

from conftest import as_pid_1, jpeg_bytes, needs_pid_namespace, write_shard


def stream(urls, rank=0, world=1, batch=16, resampled=False, **kw):
    return ShardStream(
        urls=urls,
        transform=ValPreset(24, 24).build(),
        batch_size=batch,
        rank=rank,
        world=world,
        resampled=resampled,
        **kw,
    )


def keys_of(loader) -> list[str]:
    return [key for _, _, keys in loader for key in keys]


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_split_mode_sees_every_sample_once_per_epoch_over_all_ranks(digit_shards, workers):
    source = resolve_source(str(digit_shards))
    # One loader per rank for both epochs: its workers persist and must follow the epoch's shard order.
    loaders = [EpochLoader(stream(source.train_urls, rank, 3, shuffle_buffer=50), workers) for rank in range(3)]
    for epoch in (0, 1):
        seen = Counter()
        for loader in loaders:
            loader.set_epoch(epoch)
            seen.update(keys_of(loader))
        assert sum(seen.values()) == source.train_samples == 1438
        assert set(seen.values()) == {1}
    for loader in loaders:
        loader.close()


def test_split_mode_batch_counts_match_the_plan(digit_shards):
    source = resolve_source(str(digit_shards))
    setup = plan.Setup(tuple(source.train_sizes), gpus_per_node=2, workers=2, batch_size=16, mode="split", epoch=1)
    predicted = plan.rank_plans(setup)
    for rank in range(2):
        loader = EpochLoader(stream(source.train_urls, rank, 2), workers=2)
        loader.set_epoch(1)
        assert sum(1 for _ in loader) == predicted[rank].batches


def test_resampled_mode_gives_exactly_the_epoch_length_on_every_rank(digit_shards):
    source = resolve_source(str(digit_shards))
    for rank in range(2):
        loader = EpochLoader(stream(source.train_urls, rank, 2, resampled=True), workers=2, batches=7)
        batches = list(loader)
        assert len(batches) == 7
        assert all(len(labels) == 16 for _, labels, _ in batches)


def test_batches_hold_uint8_images_labels_and_keys(digit_shards):
    source = resolve_source(str(digit_shards))
    loader = EpochLoader(
        ShardStream(urls=source.val_urls, transform=TrainPreset(24, 0.5).build(), batch_size=8), workers=0
    )
    images, labels, keys = next(iter(loader))
    assert images.shape == (8, 3, 24, 24) and str(images.dtype) == "torch.uint8"
    assert labels.tolist() == [int(k) for k in labels.tolist()] and 0 <= int(labels.min()) <= int(labels.max()) < 10
    assert len(keys) == 8 and all(isinstance(k, str) for k in keys)


def test_corrupt_samples_are_skipped_and_counted_not_fatal(tmp_path):
    samples = {f"s{i}": {"jpg": jpeg_bytes(i), "cls": b"1"} for i in range(6)}
    samples["s2"]["jpg"] = b"\xff\xd8\xff garbage"
    del samples["s4"]["cls"]
    write_shard(tmp_path / "a.tar", samples)
    loader = EpochLoader(stream([str(tmp_path / "a.tar")], batch=4), workers=1)
    assert sorted(keys_of(loader)) == ["s0", "s1", "s3", "s5"]
    assert loader.corrupt_samples == 2


def test_resampled_stream_over_empty_shards_fails_instead_of_spinning(tmp_path):
    write_shard(tmp_path / "empty.tar", {})
    loader = EpochLoader(stream([str(tmp_path / "empty.tar")], resampled=True), workers=0, batches=3)
    with pytest.raises(ImagenetTrainError, match="held no samples"):
        list(loader)


def _cut_shard(tmp_path) -> str:
    samples = {f"s{i}": {"jpg": jpeg_bytes(i), "cls": b"0"} for i in range(4)}
    write_shard(tmp_path / "a.tar", samples)
    data = (tmp_path / "a.tar").read_bytes()
    (tmp_path / "cut.tar").write_bytes(data[: len(data) // 2 + 100])
    return str(tmp_path / "cut.tar")


def test_a_truncated_shard_keeps_the_samples_before_the_damage_and_counts_the_rest(tmp_path, caplog):
    cut = _cut_shard(tmp_path)
    reading = ShardReading(expected={cut: ShardInfo(samples=4)})
    urls = [cut, str(tmp_path / "a.tar")]
    loader = EpochLoader(stream(urls, shuffle_shards=False, shuffle_buffer=0, reading=reading), workers=0)
    keys = keys_of(loader)
    kept = len(keys) - 4  # a.tar is whole
    assert 0 < kept < 4 and keys[:kept] == [f"s{i}" for i in range(kept)]
    assert loader.damage() == (0, 1, 4 - kept)  # (corrupt samples, broken shards, lost samples)
    warnings = [r.getMessage() for r in caplog.records if "broken shard" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(f"broken shard {cut}: truncated member s{kept}.")
    assert warnings[0].endswith(f"; kept {kept} samples, lost {4 - kept}")


def test_a_truncated_shard_is_an_error_naming_it_when_damage_must_stop_the_run(tmp_path):
    cut = _cut_shard(tmp_path)
    with pytest.raises(ImagenetTrainError, match="cut.tar: broken shard .*--on-broken-shard fail"):
        list(EpochLoader(stream([cut], reading=ShardReading(on_broken="fail")), workers=0))


def _failing_pipe(tmp_path) -> str:
    """A pipe: command that writes half of a four-sample shard, then fails."""
    samples = {f"s{i}": {"jpg": jpeg_bytes(i), "cls": b"0"} for i in range(4)}
    write_shard(tmp_path / "a.tar", samples)
    half = (tmp_path / "a.tar").stat().st_size // 2
    return f"pipe:head -c {half} {tmp_path / 'a.tar'}; exit 3"


def test_a_failing_pipe_command_breaks_its_shard_keeping_the_samples_before(tmp_path, caplog):
    url = _failing_pipe(tmp_path)
    reading = ShardReading(expected={url: ShardInfo(samples=4)})
    loader = EpochLoader(stream([url], shuffle_shards=False, shuffle_buffer=0, reading=reading), workers=0)
    keys = keys_of(loader)
    assert 0 < len(keys) < 4 and keys == [f"s{i}" for i in range(len(keys))]
    assert loader.damage() == (0, 1, 4 - len(keys))  # (corrupt samples, broken shards, lost samples)
    warnings = [r.getMessage() for r in caplog.records if "broken shard" in r.getMessage()]
    assert warnings == [
        f"broken shard {url}: the command exited with status 3; kept {len(keys)} samples, lost {4 - len(keys)}"
    ]


def test_a_failing_pipe_command_is_an_error_naming_it_when_damage_must_stop_the_run(tmp_path):
    url = _failing_pipe(tmp_path)
    with pytest.raises(ImagenetTrainError) as caught:
        list(EpochLoader(stream([url], reading=ShardReading(on_broken="fail")), workers=1))
    message = one_line(str(caught.value))  # as the command line prints it: the worker's last line
    assert message == f"{url}: broken shard (the command exited with status 3; --on-broken-shard fail)"


def test_a_failing_pipe_command_under_a_verifying_cache_breaks_its_shard_before_any_sample(tmp_path, caplog):
    """--cache-dir with an index's sha256: the shard is fetched whole and checked before use."""
    url = _failing_pipe(tmp_path)
    whole = (tmp_path / "a.tar").read_bytes()
    expected = {url: ShardInfo(samples=4, filesize=len(whole), sha256=hashlib.sha256(whole).hexdigest())}
    reading = ShardReading(expected=expected, cache_dir=str(tmp_path / "cache"))
    loader = EpochLoader(stream([url], reading=reading), workers=0)
    assert keys_of(loader) == [] and loader.damage() == (0, 1, 4)
    warnings = [r.getMessage() for r in caplog.records if "broken shard" in r.getMessage()]
    assert warnings == [f"broken shard {url}: the command exited with status 3; kept 0 samples, lost 4"]
    assert not [path for path in (tmp_path / "cache").rglob("*") if path.is_file()]  # nothing half-fetched kept


def test_loader_reads_shards_over_http_from_nginx(shard_server, digit_shards):
    source = resolve_source(f"{shard_server.url}/shards.json")
    assert source.val_urls[0].startswith(shard_server.url)
    local = resolve_source(str(digit_shards))
    over_http = sorted(keys_of(EpochLoader(stream(source.val_urls), workers=2)))
    assert over_http == sorted(keys_of(EpochLoader(stream(local.val_urls), workers=0)))
    assert len(over_http) == 359


def test_queue_mode_in_one_process_hands_every_shard_to_exactly_one_worker(digit_shards):
    from imagenet_train.loading.shard_queue import LocalQueue
    from imagenet_train.loading.workers import worker_context

    source = resolve_source(str(digit_shards))
    queue = LocalQueue(worker_context())
    for epoch in (0, 1):
        loader = EpochLoader(stream(source.train_urls, queue=queue), workers=3)
        loader.set_epoch(epoch)
        seen = Counter(keys_of(loader))
        assert len(seen) == 1438 and set(seen.values()) == {1}


class _Counter:
    """One queue for every rank of the test, as the job's store is."""

    def __init__(self):
        self.claims = 0

    def claim(self, epoch: int) -> int:
        self.claims += 1
        return self.claims - 1


@pytest.mark.parametrize("shards", [3, 4, 9])
def test_queue_mode_gives_every_worker_of_a_late_rank_a_shard_of_its_own(shards):
    # Rank 1's workers start first and read until the queue is empty; rank 0's start after them.
    urls, queue = [f"shard-{n}.tar" for n in range(shards)], _Counter()
    ranks = [stream(urls, rank, 2, queue=queue) for rank in (0, 1)]
    early = [list(ranks[1].shard_urls(worker, 2)) for worker in (0, 1)]
    late = [list(ranks[0].shard_urls(worker, 2)) for worker in (0, 1)]
    read = [url for worker in (*early, *late) for url in worker]
    assert sorted(read) == sorted(urls)  # every shard once
    assert [len(worker) for worker in late] == [1, 1]  # the rank that started last still has work


class _NeedsEndpoint:
    """A transform that fails (so the sample counts as corrupt) unless the worker sees AIS_ENDPOINT."""

    def __call__(self, data):
        import os

        from imagenet_train.loading.presets import decode_rgb

        assert os.environ.get("AIS_ENDPOINT") == "http://set-after-the-forkserver-started:1"
        return decode_rgb(data)[:, :8, :8]


def test_workers_see_io_environment_set_after_the_forkserver_started(digit_shards, monkeypatch):
    source = resolve_source(str(digit_shards))
    list(EpochLoader(stream(source.val_urls[:1]), workers=1))  # the forkserver exists from here on
    monkeypatch.setenv("AIS_ENDPOINT", "http://set-after-the-forkserver-started:1")
    loader = EpochLoader(ShardStream(urls=source.val_urls, transform=_NeedsEndpoint(), batch_size=64), workers=2)
    assert sum(len(keys) for _, _, keys in loader) == 359
    assert loader.corrupt_samples == 0


def _descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_rank_killed_outright_takes_its_forkserver_and_workers_with_it(digit_shards):
    """SIGKILL a process mid-epoch: its loader cannot shut down, the kernel must end the workers."""
    script = (
        "import sys, time\n"
        "from imagenet_train.datasets.source import resolve_source\n"
        "from imagenet_train.loading.presets import ValPreset\n"
        "from imagenet_train.loading.stream import EpochLoader, ShardStream\n"
        f"source = resolve_source({str(digit_shards)!r})\n"
        "stream = ShardStream(urls=source.train_urls, transform=ValPreset(24, 24).build(), batch_size=8)\n"
        "batches = iter(EpochLoader(stream, workers=2))\n"
        "next(batches)\n"
        "print('running', flush=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "running"
    helpers = _descendants(process.pid)
    assert len(helpers) >= 3  # the forkserver and two workers
    process.kill()
    process.wait()
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in helpers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in helpers if _alive(pid)], "loader processes outlived their rank"


@needs_pid_namespace
def test_a_loader_in_a_process_with_pid_1_reads_its_epoch(digit_shards):
    """A rank as its container's pid 1 (an image without an init, `--entrypoint imagenet-train`): its forkserver's
    parent is pid 1 and alive, which must not read as the parent having died before the death signal was set up."""
    script = (
        "import os\n"
        "from imagenet_train.datasets.source import resolve_source\n"
        "from imagenet_train.loading.presets import ValPreset\n"
        "from imagenet_train.loading.stream import EpochLoader, ShardStream\n"
        "assert os.getpid() == 1\n"
        f"source = resolve_source({str(digit_shards)!r})\n"
        "stream = ShardStream(urls=source.train_urls, transform=ValPreset(24, 24).build(), batch_size=64)\n"
        "loader = EpochLoader(stream, workers=1)\n"
        "print(sum(len(labels) for _, labels, _ in loader), flush=True)\n"
        "loader.close()\n"
    )
    result = as_pid_1(script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout) == 1438  # every sample of the epoch


def test_slurms_signal_to_every_loader_process_leaves_the_loader_and_its_helpers_working(digit_shards):
    """Slurm sends SIGUSR1 to every process of a job step: the loader's helpers (forkserver, workers, and
    multiprocessing's resource tracker) must leave it to the rank, which finishes and shuts down cleanly."""
    script = (
        "import signal, sys\n"
        "from imagenet_train.datasets.source import resolve_source\n"
        "from imagenet_train.loading.presets import ValPreset\n"
        "from imagenet_train.loading.stream import EpochLoader, ShardStream\n"
        "signal.signal(signal.SIGUSR1, lambda *_: None)  # the rank's own pre-emption handler\n"
        f"source = resolve_source({str(digit_shards)!r})\n"
        "stream = ShardStream(urls=source.train_urls, transform=ValPreset(24, 24).build(), batch_size=8)\n"
        "loader = EpochLoader(stream, workers=2)\n"
        "batches = iter(loader)\n"
        "first = len(next(batches)[1])\n"
        "print('running', flush=True)\n"
        "sys.stdin.readline()\n"
        "print(first + sum(len(labels) for _, labels, _ in batches), flush=True)\n"
        "loader.close()\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "running"
    helpers = _descendants(process.pid)
    assert len(helpers) >= 4  # the resource tracker, the forkserver and two workers
    for pid in [process.pid, *helpers]:
        os.kill(pid, signal.SIGUSR1)
    time.sleep(1)
    assert all(_alive(pid) for pid in helpers)
    stdout, stderr = process.communicate("go\n", timeout=120)
    assert process.returncode == 0, stderr
    assert int(stdout) == 1438  # every sample of the epoch
    assert "resource_tracker" not in stderr and "Traceback" not in stderr, stderr


def test_loader_workers_outlive_a_pre_emption_signal_sent_to_the_whole_process_group(digit_shards):
    # torchrun stops a rank with killpg and Slurm signals every process of a step; the rank finishes its step
    # and saves, so its workers must go on serving batches. torch's worker loop installs a SIGTERM handler that
    # dies of a signal its parent did not send: the worker's init must set the disposition after it.
    source = resolve_source(str(digit_shards))
    stream = ShardStream(urls=source.train_urls, transform=TrainPreset(32).build(), batch_size=8, resampled=True)
    loader = EpochLoader(stream, workers=2, batches=6)
    try:
        batches = iter(loader)
        next(batches)
        workers = [worker.pid for worker in loader.loader._iterator._workers]
        for pid in workers:
            os.kill(pid, signal.SIGTERM)  # from this process: not the worker's parent (the forkserver)
        time.sleep(0.5)
        assert len(list(batches)) == 5  # the rest of the epoch, from the same workers
        assert [worker.pid for worker in loader.loader._iterator._workers if worker.is_alive()] == workers
    finally:
        loader.close()


HANDOVER_SERVER = """
import os, sys
from multiprocessing import resource_sharer
from imagenet_train.loading.workers import worker_init
if sys.argv[1] == "worker":
    worker_init(0)
resource_sharer.DupFd(os.open(os.devnull, os.O_RDONLY))  # a descriptor offered as a worker offers a batch's
print(resource_sharer._resource_sharer._address, flush=True)
sys.stdin.readline()
"""


@pytest.mark.parametrize("process", ["worker", "plain"])
def test_a_hand_over_that_the_rank_left_prints_no_traceback_in_a_loader_worker(process):
    """Seen once in 28 fault runs: a rank stopped by SIGTERM while a worker's resource sharer was handing it a
    batch's descriptor, and the worker printed the serving thread's BrokenPipeError. A plain process still does
    (the rank leaving is simulated by a peer that connects and hangs up)."""
    import socket

    server = subprocess.Popen(
        [sys.executable, "-c", HANDOVER_SERVER, process],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    address = server.stdout.readline().strip()
    with socket.socket(socket.AF_UNIX) as peer:
        peer.connect(address)
    time.sleep(0.5)  # the serving thread meets the hang-up
    _, errors = server.communicate("\n", timeout=30)
    assert server.returncode == 0, errors
    assert ("Traceback" in errors) == (process == "plain"), errors
