"""Malformed metadata (a shard index, metrics.jsonl, a config file) ends in one line and exit 2, never a
traceback, and the line never echoes more than ~80 characters of what it read."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagenet_train.cli import main
from imagenet_train.datasets.source import load_index
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.ops.run_report import read_records, samples_seen, summary_table

SHARD = {"url": "x.tar", "nsamples": 2, "filesize": 20480, "sha256": "ab" * 32, "md5sum": "cd" * 16}
INDEX = {
    "__kind__": "wids-shard-index-v1",
    "splits": {"train": {"shardlist": [SHARD], "nsamples": 2}, "val": {"shardlist": [SHARD], "nsamples": 2}},
    "classes": ["a", "b"],
}
RECORD = {
    "epoch": 0,
    "train_loss": 2.3,
    "train_samples": 64,
    "batches_per_rank": [2, 2],
    "samples_per_s": 100.0,
    "val_loss": 2.2,
    "top1": 0.1,
    "top5": 0.5,
    "data_wait_fraction": 0.1,
    "data_wait_per_rank": [0.1, 0.1],
}


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("imagenet-train: error: "), lines
    assert len(lines[0]) < 400, lines[0]
    return lines[0]


def mutated(change) -> dict:
    document = copy.deepcopy(INDEX)
    change(document, document["splits"]["train"]["shardlist"][0])
    return document


MALFORMED_INDEXES = {
    "url is a number": (lambda d, s: s.update(url=7), "shard 0: url: expected text, got '7'"),
    "url is missing": (lambda d, s: s.pop("url"), "shard 0: url: expected text"),
    "nsamples is text": (lambda d, s: s.update(nsamples="2"), "shard 0: nsamples: expected a whole number"),
    "nsamples is missing": (lambda d, s: s.pop("nsamples"), "shard 0: nsamples: expected a whole number"),
    "nsamples is negative": (lambda d, s: s.update(nsamples=-1), "shard 0: nsamples: expected a whole number"),
    "nsamples is a fraction": (lambda d, s: s.update(nsamples=1.5), "shard 0: nsamples: expected a whole number"),
    "nsamples is true": (lambda d, s: s.update(nsamples=True), "shard 0: nsamples: expected a whole number"),
    "filesize is text": (lambda d, s: s.update(filesize="big"), "shard 0: filesize: expected a whole number"),
    "sha256 is not hex": (lambda d, s: s.update(sha256="zz" * 32), "shard 0: sha256: expected [0-9a-fA-F]{64}"),
    "md5sum is a list": (lambda d, s: s.update(md5sum=[1]), "shard 0: md5sum: expected"),
    "a shard entry is text": (
        lambda d, s: d["splits"]["train"].update(shardlist=["x.tar"]),
        "shard 0: expected a mapping with url and nsamples, got 'x.tar'",
    ),
    "a split is null": (lambda d, s: d["splits"].update(train=None), "split 'train': expected a mapping"),
    "a shardlist is text": (lambda d, s: d["splits"]["train"].update(shardlist="x"), "split 'train': expected"),
    "splits is a list": (lambda d, s: d.update(splits=[]), "splits: expected a mapping"),
    "classes is text": (lambda d, s: d.update(classes="ab"), "classes: expected a list of class names"),
    "classes holds numbers": (lambda d, s: d.update(classes=[1, 2]), "classes: expected a list of class names"),
    "a url is 10,000 characters": (lambda d, s: s.update(url="a" * 10_000 + "/../../x"), "shard 0: url 'aaaa"),
}


@pytest.mark.parametrize("case", list(MALFORMED_INDEXES))
def test_malformed_index_is_one_line_naming_file_split_and_entry(case, hostile_dir, hostile_server, capsys):
    change, expected = MALFORMED_INDEXES[case]
    (hostile_dir / "shards.json").write_text(json.dumps(mutated(change)))
    index = f"{hostile_server.url}/shards.json"
    assert main(["probe", index]) == 2
    line = one_error_line(capsys)
    assert index in line and expected in line, line


def test_index_with_nan_is_one_line(hostile_dir, hostile_server, capsys):
    (hostile_dir / "shards.json").write_text(json.dumps(INDEX).replace('"nsamples": 2,', '"nsamples": NaN,', 1))
    index = f"{hostile_server.url}/shards.json"
    assert main(["plan", "--shards", index]) == 2
    assert f"{index}: split 'train' shard 0: nsamples: expected a whole number" in one_error_line(capsys)


METRICS = {
    "Infinity": ('{"epoch": 1, "train_loss": Infinity}', "line 2: field 'train_loss': expected a finite number"),
    "NaN": (json.dumps({**RECORD, "epoch": 1, "top5": math.nan}), "line 2: field 'top5': expected a finite number"),
    "text in a number": (
        json.dumps({**RECORD, "epoch": 1, "top1": "high"}),
        "line 2: field 'top1': expected a finite number >= 0, got 'high'",
    ),
    "text as the epoch": (json.dumps({**RECORD, "epoch": "one"}), "line 2: field 'epoch': expected a whole number"),
    "a huge number": (json.dumps({**RECORD, "epoch": 1}).replace("2.3", "1e999"), "line 2: field 'train_loss'"),
    "empty batches": (json.dumps({**RECORD, "epoch": 1, "batches_per_rank": []}), "field 'batches_per_rank'"),
    "a field missing": (json.dumps({"epoch": 1}), "line 2: no 'train_loss'"),
    "not an object": ("[1, 2, 3]", "line 2: expected a JSON object with 'epoch'"),
    "a huge line": ('{"epoch": 1, "x": "' + "a" * (2 << 20) + '"}', "line 2: longer than 1048576 bytes"),
}


@pytest.mark.parametrize("case", list(METRICS))
def test_report_on_malformed_metrics_is_one_line_naming_file_line_and_field(case, tmp_path, capsys):
    line, expected = METRICS[case]
    (tmp_path / "metrics.jsonl").write_text(json.dumps(RECORD) + "\n" + line + "\n")
    assert main(["report", str(tmp_path)]) == 2
    error = one_error_line(capsys)
    assert str(tmp_path / "metrics.jsonl") in error and expected in error, error


def billion_laughs(levels: int) -> str:
    """A few hundred bytes of YAML whose aliases expand to 9**levels strings."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nbatch_size: *a{levels - 1}\n"


def test_config_with_yaml_aliases_is_one_short_line(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(billion_laughs(6))
    assert len(path.read_bytes()) < 400
    assert main(["train", "--config", str(path)]) == 2
    line = one_error_line(capsys)
    assert f"--config {path}: a YAML alias (*name) at line 2" in line, line


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("batch_size: " + "9" * 5000 + "x\n", "batch_size (--batch-size): expected a whole number"),
        ("batch_size: " + "9" * 5000 + "\n", "not valid YAML or JSON"),
        ("arch: [" + ", ".join(["x" * 50] * 200) + "]\n", "arch (--arch): expected text, got '['xxx"),
        ("? " + "x" * 5000 + "\n: 1\n", "unknown setting 'xxx"),
    ],
)
def test_config_errors_echo_at_most_80_characters_of_a_value(content, expected, tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(content)
    assert main(["train", "--config", str(path)]) == 2
    line = one_error_line(capsys)
    assert expected in line and "9" * 81 not in line and "x" * 81 not in line, line


# -- properties: random and mutated inputs end in a result or ImagenetTrainError, nothing else --------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=300),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=8,
)


def paths_in(value, prefix=()):
    """Every (path, value) of a JSON document, the document itself included."""
    yield prefix, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for key, child in items:
        yield from paths_in(child, (*prefix, key))


@st.composite
def mutations(draw, base: dict) -> dict:
    """`base` with a few of its values swapped for random JSON, or their keys dropped."""
    document = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        places = [path for path, _ in paths_in(document) if path]
        if not places:
            break
        path = draw(st.sampled_from(places))
        holder = document
        for key in path[:-1]:
            holder = holder[key]
        if isinstance(holder, dict) and draw(st.booleans()):
            del holder[path[-1]]
        else:
            holder[path[-1]] = draw(JSON_VALUES)
    return document


def encode(document) -> str:
    """JSON as Python writes it: NaN and Infinity included, as a careless or hostile writer would."""
    return json.dumps(document, allow_nan=True)


@pytest.mark.timeout(60)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mutations(INDEX).map(encode) | st.text(max_size=200) | mutations(INDEX).map(lambda d: encode(d)[:-7]))
def test_index_loader_on_random_and_mutated_indexes_gives_an_index_or_one_error(text, tmp_path):
    path = Path(tmp_path) / "shards.json"
    path.write_text(text)
    try:
        index = load_index(str(path))
    except ImagenetTrainError as error:
        assert "\n" not in str(error)
        return
    for split in index.splits():
        assert all(isinstance(url, str) and url.startswith(str(tmp_path)) for url in index.urls(split))
        assert all(isinstance(n, int) and 0 <= n <= 10_000_000 for n in index.sizes(split))
        assert all(size is None or isinstance(size, int) for size in index.filesizes(split))
        assert index.nsamples(split) >= 0
    assert all(isinstance(name, str) for name in index.classes)


@pytest.mark.timeout(60)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(
        mutations(RECORD).map(encode) | st.just(encode(RECORD)) | st.text(max_size=100),
        min_size=1,
        max_size=4,
    )
)
def test_metrics_reader_on_random_and_mutated_records_gives_a_table_or_one_error(lines, tmp_path):
    (Path(tmp_path) / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    try:
        records = read_records(Path(tmp_path))
    except ImagenetTrainError as error:
        assert "\n" not in str(error)
        return
    table = summary_table(records)
    assert len(table.splitlines()) == len(records) + 1
    assert all(isinstance(seen, int) and not math.isnan(seen) for seen in samples_seen(records))
