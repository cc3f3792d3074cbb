"""The console script refuses a URL whose scheme io/schemes.py's table lacks, or one it cannot write to, in one
line with exit 2, before a run directory or any output exists."""

from conftest import cli


def test_train_with_shards_of_an_unknown_scheme_exits_2_in_one_line_before_the_run_starts(tmp_path):
    run_dir = tmp_path / "run"
    ended = cli("train", "--shards", "foo://user:pw@x/shards.json", "--run-dir", str(run_dir), "--epochs", "1")
    lines = ended.stderr.strip().splitlines()
    assert ended.returncode == 2, ended.stderr[-2000:]
    assert len(lines) == 1, lines
    assert lines[0].startswith("imagenet-train: error: --shards: 'foo://***@x/shards.json' names the scheme 'foo:'")
    assert "http://, https://, gs://, s3://, ais://, pipe:" in lines[0]
    assert not run_dir.exists()


def test_upload_to_a_scheme_without_a_writer_exits_2_in_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    ended = cli("upload", str(tmp_path / "run"), "s3://bucket/runs/r1")
    assert ended.returncode == 2, ended.stderr[-2000:]
    assert ended.stderr.strip().splitlines() == [
        "imagenet-train: error: URL: 's3://bucket/runs/r1' names s3://, which is read only here; expected a URL of "
        "a scheme with a writer: gs://"
    ]
