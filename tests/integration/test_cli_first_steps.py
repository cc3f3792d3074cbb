"""What a new user tries first: --version, the bare command, a misspelled flag, command or config key, and a dry run
of a recipe (`train --config FILE --print-config`) that reads no data and starts nothing."""

import os
import subprocess
import sys

import yaml

from imagenet_train.ops.serve import free_port

from conftest import cli

RECIPE = "recipes/rn50-ffcv-16.yaml"  # global batch 4,096, lr 0.10625 per 256, queue mode, 16 epochs


def _one_line(result, *fragments):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("imagenet-train: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_version_names_the_package_revision_and_torch_and_exits_0():
    import torch

    import imagenet_train

    result = cli("--version")
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith(f"imagenet-train {imagenet_train.__version__} (git ")
    assert f"torch {torch.__version__}" in line


def test_the_revision_comes_from_the_image_when_it_says_one():
    env = {**os.environ, "IMAGENET_TRAIN_REVISION": "0123456789abcdef"}
    result = subprocess.run(
        [sys.executable, "-m", "imagenet_train.cli", "--version"], capture_output=True, text=True, env=env
    )
    assert "(git 0123456789ab)" in result.stdout, result.stdout + result.stderr


def test_a_bare_call_lists_the_commands_and_exits_2():
    result = cli()
    assert result.returncode == 2
    assert "usage: imagenet-train" in result.stdout
    for command in ("shards", "train", "evaluate", "plan", "report"):
        assert f"\n    {command} " in result.stdout


def test_a_misspelled_flag_suggests_the_declared_one():
    _one_line(cli("train", "--batch-szie", "3"), "--batch-szie", "did you mean --batch-size?")
    _one_line(cli("train", "--lr-shedule=cosine"), "did you mean --lr-schedule?")


def test_a_flag_nothing_like_any_declared_one_gets_no_suggestion():
    result = cli("train", "--zzzz", "3")
    _one_line(result, "unrecognized arguments: --zzzz 3")
    assert "did you mean" not in result.stderr


def test_a_misspelled_command_suggests_the_command():
    _one_line(cli("trian"), "invalid choice: 'trian'", "did you mean 'train'?")


def test_a_misspelled_config_key_suggests_the_setting(tmp_path):
    config = tmp_path / "recipe.yaml"
    config.write_text("batch_szie: 64\n")
    _one_line(cli("train", "--config", str(config)), "batch_szie", "did you mean batch_size?")


def test_print_config_shows_the_recipes_values_and_what_they_derive():
    result = cli("train", "--config", RECIPE, "--print-config")
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["optim"]["lr"] == 0.10625 and printed["run"]["epochs"] == 16
    derived = printed["derived"]
    assert derived["world_size"] == 1 and derived["global_batch"] == 4096
    assert derived["base_lr"] == 1.7  # 0.10625 x 4096 / 256
    assert derived["mode"] == "queue"
    assert derived["total_batches"].startswith("unknown until the index is read")


def test_print_config_applies_flags_over_the_file_and_the_world_size_torchrun_gives(tmp_path):
    env = {**os.environ, "WORLD_SIZE": "8"}
    args = ["--config", RECIPE, "--print-config", "--epochs", "2", "--train-urls", "http://h/x-{0..9}.tar"]
    args += ["--train-samples", "40960", "--mode", "resampled"]
    executable = os.path.join(os.path.dirname(sys.executable), "imagenet-train")
    result = subprocess.run([executable, "train", *args], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    derived = printed["derived"]
    assert printed["run"]["epochs"] == 2
    assert (derived["world_size"], derived["batch_size"], derived["global_batch"]) == (8, 512, 4096)
    assert (derived["epoch_batches"], derived["total_batches"]) == (10, 20)  # 40,960 / 4,096 per step, 2 epochs


def test_print_config_output_is_a_config_file_train_takes_back(tmp_path):
    printed = cli("train", "--config", RECIPE, "--print-config", "--lr", "0.2")
    again = tmp_path / "resolved.yaml"
    again.write_text(printed.stdout)
    second = cli("train", "--config", str(again), "--print-config")
    assert second.returncode == 0, second.stderr
    assert yaml.safe_load(second.stdout) == yaml.safe_load(printed.stdout)


def test_print_config_reads_no_data_and_starts_no_process_group(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/shards.json"  # nothing listens: a read would wait out --io-timeout
    script = (
        "import sys; from imagenet_train.cli import main; "
        f"code = main(['train', '--shards', '{dead}', '--print-config']); "
        "print('loaded:', sorted(m for m in ('torch', 'torch.distributed') if m in sys.modules)); sys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "loaded: []" in result.stdout
    assert yaml.safe_load(result.stdout.split("loaded:")[0])["data"]["shards"] == dead


def test_print_config_refuses_a_global_batch_that_does_not_divide_over_the_ranks():
    env = {**os.environ, "WORLD_SIZE": "3"}
    executable = os.path.join(os.path.dirname(sys.executable), "imagenet-train")
    result = subprocess.run(
        [executable, "train", "--config", RECIPE, "--print-config"], capture_output=True, text=True, env=env
    )
    _one_line(result, "--global-batch-size", "4096", "3 ranks")


def test_train_help_says_print_config_shows_a_recipes_values():
    result = cli("train", "--help")
    assert "--print-config" in result.stdout
    assert "built-in" in " ".join(result.stdout.split())
