"""Numbers and totals read from files a run may get from elsewhere (a checkpoint, a shard, metrics.jsonl):
every number is checked before use, every reader bounds what it keeps in total. Random and mutated inputs
end in a normal result or one error line, within a memory bound."""

from __future__ import annotations

import copy
import io
import json
import math
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.loading import stages
from imagenet_train.loading.stages import BrokenShard, samples_in_tar
from imagenet_train.ops.run_report import read_records, summary_table
from imagenet_train.rundir import checkpoint
from imagenet_train.rundir.checkpoint import RunState
from security.test_malformed_inputs import JSON_VALUES, RECORD, encode, mutations


def _parts() -> dict:
    model = torch.nn.Linear(2, 2)
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)}


def _saved(path: Path, position: dict | None = None) -> dict:
    """A real checkpoint of a tiny run (tensors and plain data, as RunState writes it); its state."""
    parts = _parts()
    state = {"epoch": 3, "position": position, "scaler": {}, **{k: p.state_dict() for k, p in parts.items()}}
    checkpoint.save(state, path)
    return checkpoint.plain(state)


def _restored_or_one_line(path: Path) -> tuple[int, object] | None:
    try:
        return RunState(path.parent, _parts(), {}).restore(path)
    except ImagenetTrainError as error:
        assert "\n" not in str(error) and str(path) in str(error), str(error)
        return None


MAX_EPOCH = 1_000_000  # planning/position.py's bound
POSITION = {"epoch": 4, "step": 6, "segments": [0, 2], "world": 2, "samples_left": 0}
HUGE = st.sampled_from([2**63, 2**80, -1, 1e300, float("nan"), float("inf"), True, 2.0, "7", None, [], {}])


@st.composite
def mutated_states(draw) -> tuple[dict | None, object, object]:
    """A position (mutated, or with a field swapped for an out-of-range number), an epoch and a learning rate."""
    position = copy.deepcopy(draw(st.none() | mutations(POSITION) | st.just(POSITION)))
    if isinstance(position, dict) and position and draw(st.booleans()):
        position[draw(st.sampled_from(sorted(position)))] = draw(HUGE)
    return position, draw(HUGE | JSON_VALUES | st.integers(0, 100)), draw(HUGE | st.just(0.1))


@pytest.mark.timeout(120)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutated=mutated_states())
def test_a_checkpoint_with_any_numbers_resumes_in_range_or_is_one_line(mutated, tmp_path):
    position, epoch, lr = mutated
    path = Path(tmp_path) / "epoch-0003.pt"
    parts = _parts()
    optimizer = parts["optimizer"].state_dict()
    optimizer["param_groups"][0]["lr"] = lr
    state = {"epoch": epoch, "position": position, "scaler": {}, "model": parts["model"].state_dict()}
    checkpoint.save({**state, "optimizer": optimizer}, path)
    resumed = _restored_or_one_line(path)
    if resumed is not None:
        start, at = resumed
        assert type(start) is int and 0 <= start <= MAX_EPOCH
        assert at is None or (at.epoch == start and all(0 <= s <= at.step for s in at.segments))
        assert isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr)


@pytest.mark.timeout(120)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), flips=st.integers(1, 8), cut=st.booleans())
@example(seed=161, flips=1, cut=False)  # is_zipfile itself raised BadZipFile: a traceback
def test_a_checkpoint_with_mutated_bytes_resumes_or_is_one_line(seed, flips, cut, tmp_path):
    path = Path(tmp_path) / "epoch-0003.pt"
    _saved(path, POSITION)
    data = bytearray(path.read_bytes())
    rng = random.Random(seed)
    for _ in range(flips):
        data[rng.randrange(len(data))] = rng.randrange(256)
    path.write_bytes(bytes(data[: rng.randrange(len(data))] if cut else data))
    _restored_or_one_line(path)


@pytest.mark.timeout(60)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(mutations(RECORD).map(encode) | st.just(encode(RECORD)), min_size=1, max_size=6))
def test_metrics_with_any_numbers_give_a_table_or_one_line(lines, tmp_path):
    (Path(tmp_path) / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    try:
        records = read_records(Path(tmp_path))
    except ImagenetTrainError as error:
        assert "\n" not in str(error)
        return
    assert len(summary_table(records).splitlines()) == len(records) + 1


def _tar(members: list[tuple[str, int]]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, size in members:
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
    buffer.seek(0)
    return buffer


def test_a_sample_with_too_many_members_breaks_its_shard_not_the_memory():
    members = [("s0.jpg", 10), ("s0.cls", 1), *[(f"s1.m{i}", 10) for i in range(1000)]]
    samples = samples_in_tar(_tar(members), "shard.tar")
    assert next(samples)["__key__"] == "s0"  # the sample before the damage is kept
    with pytest.raises(BrokenShard, match="sample 's1'"):
        next(samples)


def test_a_sample_whose_members_add_up_past_the_bound_breaks_its_shard(monkeypatch):
    # The bound as it is, scaled down to stay fast.
    monkeypatch.setattr(stages, "MAX_SAMPLE_BYTES", 1 << 20, raising=False)
    members = [("s0.a", 600_000), ("s0.b", 600_000)]  # each member within the tar reader's own bound
    with pytest.raises(BrokenShard, match="MiB in all"):
        list(samples_in_tar(_tar(members), "shard.tar"))


# Reads hostile inputs the way train --resume and report do, and prints the peak RSS in MB before and after:
# checkpoints with mutated bytes and directory sizes, and metrics files with very many records.
READ_MEASURED = """
import json, random, resource, sys
from pathlib import Path
import torch
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.rundir import checkpoint
from imagenet_train.ops.run_report import read_records
folder, RECORD = Path(sys.argv[1]), json.loads(sys.argv[2])
model = torch.nn.Linear(64, 64)
good = folder / "good.pt"
checkpoint.save({"epoch": 0, "model": model.state_dict(), "optimizer": {}, "scaler": {}}, good)
data = good.read_bytes()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
rng, outcomes = random.Random(0), set()
for n in range(40):
    mutated = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        at = data.rfind(b"PK\\x01\\x02") if n % 2 else rng.randrange(len(data))
        mutated[rng.randrange(at, min(len(data), at + 46))] = 255  # central directory sizes, or anywhere
    (folder / "m.pt").write_bytes(bytes(mutated))
    try:
        checkpoint.load(folder / "m.pt")
        outcomes.add("loaded")
    except ImagenetTrainError as error:
        outcomes.add("error")
        assert "\\n" not in str(error)
# 1 MB records of ~4 MB each once parsed (a list of 500,000 numbers), under and over the 64 MiB file bound:
# each is kept until its epoch's last.
record = json.dumps({**RECORD, "epoch": 12345678, "x": [0] * 500_000}, separators=(",", ":")).encode()
for count in (10, 100):
    with open(folder / "metrics.jsonl", "wb") as stream:
        for n in range(count):
            stream.write(record.replace(b'12345678', b'%d' % n) + b'\\n')
    try:
        outcomes.add(f"{len(read_records(folder))} records")
    except ImagenetTrainError as error:
        outcomes.add("error")
        assert "\\n" not in str(error)
print(sorted(outcomes))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def test_hostile_checkpoints_and_metrics_are_read_within_a_memory_bound(tmp_path):
    command = [sys.executable, "-c", READ_MEASURED, str(tmp_path), json.dumps(RECORD)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    before, outcomes, after = result.stdout.strip().splitlines()
    assert "error" in outcomes, outcomes
    assert int(after) < int(before) + 150, f"peak RSS went from {before} MB to {after} MB ({outcomes})"
