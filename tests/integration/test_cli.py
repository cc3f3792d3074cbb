"""The `imagenet-train` command: help with defaults, summaries, and one-line errors with exit code 2."""

import shutil

import pytest

from imagenet_train.ops.serve import free_port

from conftest import cli, write_image_folder


@pytest.mark.parametrize(
    "command", ["shards", "summarize", "train", "evaluate", "serve", "demo-data", "fashion-mnist", "ray", "report"]
)
def test_every_command_has_help_with_defaults(command):
    result = cli(command, "--help")
    assert result.returncode == 0
    assert "usage: imagenet-train " + command in result.stdout
    if command not in ("summarize", "report"):
        assert "(default:" in result.stdout


def test_shards_then_summarize_prints_brace_notation_and_counts(tmp_path):
    write_image_folder(tmp_path / "in", {"n01": 5, "n02": 5}, {"n01": 2, "n02": 2})
    made = cli("shards", str(tmp_path / "in"), str(tmp_path / "out"), "--maxcount", "3", "--quiet")
    assert made.returncode == 0, made.stderr
    assert "train: 10 samples in 4 shards" in made.stdout
    summary = cli("summarize", str(tmp_path / "out"))
    assert "train: 10 samples in 4 shards: imagenet-train-train-{000000..000003}.tar" in summary.stdout
    assert "val: 4 samples in 2 shards: imagenet-train-val-{000000..000001}.tar" in summary.stdout


def _assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("imagenet-train: error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[-1]


def test_missing_input_directory_is_one_line(tmp_path):
    _assert_one_line_error(cli("shards", str(tmp_path / "nope"), str(tmp_path / "out")), "nope", "does not exist")


def test_train_with_no_index_is_one_line(tmp_path):
    _assert_one_line_error(cli("train", "--shards", str(tmp_path)), "no shard index here")


def test_train_against_an_unreachable_server_fails_after_the_io_budget(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/shards.json"
    result = cli("train", "--shards", url, "--io-timeout", "2")
    _assert_one_line_error(result, url, "unreachable for", "Connection refused")


def test_missing_shard_during_training_names_it_from_the_worker(digit_shards, tmp_path):
    copy = tmp_path / "shards"
    shutil.copytree(digit_shards, copy)
    victim = sorted(copy.glob("imagenet-train-val-*.tar"))[0]
    victim.unlink()
    result = cli(
        "train",
        "--shards",
        str(copy),
        "--arch",
        "resnet18",
        "--image-size",
        "16",
        "--epochs",
        "1",
        "--epoch-batches",
        "1",
        "--batch-size",
        "8",
        "--workers",
        "1",
        "--run-dir",
        str(tmp_path / "run"),
    )
    _assert_one_line_error(result, victim.name, "cannot open")


def test_bad_option_values_name_the_option(digit_shards):
    _assert_one_line_error(cli("train", "--shards", str(digit_shards), "--mode", "exact"), "--mode", "resampled")
    _assert_one_line_error(cli("train", "--shards", str(digit_shards), "--arch", "resnet9000"), "--arch")


def test_a_queue_mode_batch_larger_than_the_data_is_refused_before_any_step_even_with_force(digit_shards, tmp_path):
    run_dir = tmp_path / "run"
    result = cli(
        *("train", "--shards", str(digit_shards), "--mode", "queue", "--batch-size", "4096", "--force"),
        *("--run-dir", str(run_dir)),
    )
    _assert_one_line_error(
        result,
        "pre-flight: REFUSED: --batch-size 4096 on 1 rank is a global batch of 4096, more than the 1438 samples",
        "--batch-size 1438 or lower",
    )
    assert not (run_dir / "metrics.jsonl").exists()


def test_a_stalled_shard_server_fails_the_run_with_a_message_not_a_hang(digit_shards, tmp_path):
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted = []
    threading.Thread(target=lambda: [accepted.append(listener.accept()) for _ in range(16)], daemon=True).start()
    port = listener.getsockname()[1]
    try:
        result = cli(
            "train",
            "--train-urls",
            f"http://127.0.0.1:{port}/x-{{0..3}}.tar",
            "--train-samples",
            "64",
            "--num-classes",
            "10",
            "--arch",
            "resnet18",
            "--image-size",
            "16",
            "--batch-size",
            "8",
            "--workers",
            "1",
            "--epochs",
            "1",
            "--io-timeout",
            "2",
            "--loader-timeout",
            "4",
            "--run-dir",
            str(tmp_path / "run"),
            timeout=100,
        )
    finally:
        listener.close()
    # Whichever limit ends it first (the worker's --io-timeout 2 s on its read, or the rank's --loader-timeout 4 s
    # while a worker is still starting), the run ends in one line naming the server, never in a hang. Since the
    # workers' forkserver preloads their imports, the worker's own budget usually ends it.
    _assert_one_line_error(result, f"127.0.0.1:{port}")
    last = result.stderr.strip().splitlines()[-1]
    assert "within 4s" in last and "stalled" in last or "gave up at --io-timeout 2 s" in last, last


def test_train_refuses_a_configuration_the_planner_says_will_hang(digit_shards):
    result = cli("train", "--shards", str(digit_shards), "--batch-size", "4000", "--epochs", "1")
    _assert_one_line_error(result, "pre-flight: WILL HANG", "--force runs anyway")
