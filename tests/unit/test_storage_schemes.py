"""The storage schemes as one table (io/schemes.py): every URL is opened through its entry, loader workers get the
entries' variables, and a URL naming a scheme the table lacks is refused in one line when the settings are read."""

import io
import json
import re

import pytest

from imagenet_train import cli
from imagenet_train.cli import build_parser
from imagenet_train.commands.train_cmd import _config_from
from imagenet_train.datasets.source import load_index
from imagenet_train.io import schemes, storage, transfer
from imagenet_train.io.schemes import SCHEMES, Scheme
from imagenet_train.main.entry_checks import runnable as checked

from conftest import REPO, refusal

pytestmark = pytest.mark.unit

DOCS = REPO / "docs"


def config_of(*flags: str):
    return _config_from(build_parser().parse_args(["train", *flags]))


def cli_refusal(argv: list[str], capsys, monkeypatch) -> str:
    """The one stderr line of a command refused before it starts (exit 2); starting is a failure."""

    def started(args):
        raise AssertionError(f"{argv[0]} started instead of refusing its settings")

    monkeypatch.setattr(cli, "dispatch", started)
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    ("setting", "flags"),
    [
        ("--shards", ["--shards", "foo://x/shards.json"]),
        ("--train-urls", ["--train-urls", "foo://x/train-{000..009}.tar"]),
        ("--val-urls", ["--train-urls", "http://h/t-0.tar", "--val-urls", "http://h/v.tar::foo://x/v-{0..1}.tar"]),
    ],
    ids=["shards", "train-urls", "val-urls"],
)
def test_a_url_setting_naming_an_unknown_scheme_is_refused_in_one_line_with_exit_2(setting, flags, capsys, monkeypatch):
    line = cli_refusal(["train", *flags, "--num-classes", "10"], capsys, monkeypatch)
    assert line.startswith(f"imagenet-train: error: {setting}: 'foo://x/")
    assert "names the scheme 'foo:'" in line
    assert line.endswith(f"expected one of: {schemes.known()} (docs/data.md, Shard URLs)")


def test_the_schemes_known_are_every_entry_of_the_table_and_those_with_a_writer():
    assert schemes.known().split(", ")[0] == "file:// (or a plain path)"
    assert all(f"{name}:" in schemes.known() for name in SCHEMES)
    assert schemes.known(writable=True) == "gs://"


def test_the_refusal_shows_the_url_redacted(capsys, monkeypatch):
    line = cli_refusal(["train", "--shards", "foo://alice:hunter2@x/shards.json?sig=s3cr3t"], capsys, monkeypatch)
    assert "hunter2" not in line and "s3cr3t" not in line
    assert "foo://***@x/shards.json?sig=***" in line


@pytest.mark.parametrize("url", ["hf://datasets/acme/imagenet/train-0.tar", "sftp://h/x.tar", "htgs://b/x.tar"])
def test_schemes_only_webdataset_could_open_are_refused_like_any_unknown_one(url):
    name = url.split(":")[0]
    assert f"names the scheme '{name}:'" in refusal(lambda: storage.open_stream(url))
    assert f"names the scheme '{name}:'" in refusal(lambda: checked(config_of("--shards", url)))


def test_results_naming_a_scheme_without_a_writer_is_refused_when_the_settings_are_read(capsys, monkeypatch):
    line = cli_refusal(["train", "--shards", "x", "--results", "s3://b/runs/r1"], capsys, monkeypatch)
    assert line == (
        "imagenet-train: error: --results: 's3://b/runs/r1' names s3://, which is read only here; expected a URL of "
        "a scheme with a writer: gs://"
    )
    assert checked(config_of("--shards", "x", "--results", "gs://b/runs/r1")).run.results == "gs://b/runs/r1"


def test_upload_and_shards_to_a_read_only_scheme_are_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    (tmp_path / "run").mkdir()
    assert "names s3://, which is read only here" in refusal(lambda: transfer.plan_upload(str(tmp_path), "s3://b/p"))
    assert cli.main(["upload", str(tmp_path / "run"), "ais://b/p"]) == 2
    assert "error: URL: 'ais://b/p' names ais://, which is read only" in capsys.readouterr().err
    assert cli.main(["shards", str(tmp_path / "run"), "s3://b/shards"]) == 2
    assert "OUTPUT: 's3://b/shards' names s3://, which is read only" in capsys.readouterr().err
    assert list((tmp_path / "run").iterdir()) == []


def test_an_index_naming_a_shard_of_an_unknown_scheme_is_refused_when_loaded_even_under_trust_index(tmp_path):
    index = {
        "__kind__": "wids-shard-index-v1",
        "splits": {"train": {"shardlist": [{"url": "foo://h/x.tar", "nsamples": 1}]}},
    }
    (tmp_path / "shards.json").write_text(json.dumps(index))
    message = refusal(lambda: load_index(str(tmp_path), trust_index=True))
    assert message.startswith(
        f"{tmp_path / 'shards.json'}: split 'train' shard 0: url: 'foo://h/x.tar' names the scheme"
    )


def test_every_scheme_in_the_table_has_an_opener_and_open_stream_goes_through_it(monkeypatch):
    opened = []
    for name, scheme in list(SCHEMES.items()):
        assert scheme.name == name and callable(scheme.opens)
        monkeypatch.setitem(SCHEMES, name, Scheme(name, lambda url, timeout, n=name: opened.append(n) or io.BytesIO()))
    for name in SCHEMES:
        storage.open_stream("pipe:true" if name == "pipe" else "/a/path" if name == "file" else f"{name}://b/x.tar")
    assert opened == list(SCHEMES)


def test_the_local_and_pipe_entries_read_what_they_name(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"local bytes")
    for location in (str(tmp_path / "x.bin"), (tmp_path / "x.bin").as_uri(), f"pipe:cat {tmp_path / 'x.bin'}"):
        with storage.open_stream(location) as stream:
            assert stream.read() == b"local bytes"


def test_the_worker_environment_comes_from_the_table(monkeypatch):
    assert schemes.worker_environment() == storage.IO_ENVIRONMENT
    for scheme in SCHEMES.values():
        assert set(scheme.environment) <= set(storage.IO_ENVIRONMENT)
    monkeypatch.setenv("SCRATCH_TOKEN", "t")
    assert "SCRATCH_TOKEN" not in storage.io_environment()
    monkeypatch.setitem(SCHEMES, "scratch", Scheme("scratch", lambda url, timeout: io.BytesIO(), ("SCRATCH_",)))
    assert storage.io_environment()["SCRATCH_TOKEN"] == "t"
    storage.apply_io_environment({})  # a snapshot taken without it: the variable goes, as a worker's would
    assert "SCRATCH_TOKEN" not in storage.io_environment()


def test_a_scheme_added_to_the_table_is_read_and_accepted_by_the_settings(monkeypatch):
    monkeypatch.setitem(SCHEMES, "scratch", Scheme("scratch", lambda url, timeout: io.BytesIO(url.encode())))
    cfg = checked(config_of("--train-urls", "scratch://b/x-{0..3}.tar", "--num-classes", "2"))
    assert cfg.data.train_urls == "scratch://b/x-{0..3}.tar"
    assert storage.read_bytes("scratch://b/x-0.tar") == b"scratch://b/x-0.tar"


def test_a_spec_of_many_shards_is_checked_without_expanding_them():
    for spec in ("http://h/x-{0000000000..9999999999}.tar", "pipe:cat x-{0000000000..9999999999}", "x-{0..9999999999}"):
        schemes.check_spec("--train-urls", spec)  # returns at once
    assert "names the scheme 'sftp:'" in refusal(lambda: schemes.check_spec("--train-urls", "{gs,sftp}://b/x.tar"))
    assert "names the scheme 'foo:'" in refusal(lambda: schemes.check_spec("--train-urls", "{x,foo:}y"))
    hostile = refusal(lambda: schemes.check_spec("--val-urls", "h{0..9999999999}://x/y.tar"))  # at once, no memory
    assert hostile == (
        "--val-urls: 'h{0..9999999999}://x/y.tar': braces around the scheme; expected them in the shard names "
        "(e.g. 'http://h/train-{000000..000146}.tar')"
    )
    assert "braces around the scheme" in refusal(lambda: schemes.check_spec("--train-urls", "{gs:/b/x}.tar"))
    assert "unbalanced braces" in refusal(lambda: schemes.check_spec("--train-urls", "http://h/x-{0..9.tar"))
    schemes.check_spec("--train-urls", "http://h/x-\\{0.tar")  # an escaped brace needs no pair


def test_docs_data_md_lists_exactly_the_schemes_of_the_table():
    text = (DOCS / "data.md").read_text()
    section = text.split("## Shard URLs", 1)[1].split("\n## ", 1)[0]
    schemes_list = section.split("The schemes:", 1)[1].split("A URL of any other scheme", 1)[0]
    listed = set(re.findall(r"^- .*?`([a-z0-9]+):", schemes_list, re.MULTILINE))
    listed |= set(re.findall(r"`([a-z0-9]+)://`", schemes_list))
    assert listed == set(SCHEMES)
