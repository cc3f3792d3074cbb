"""The --auto-augment table on both decoder paths: an unknown word refused in one line, exit 2, from the flag and
from a config file; a policy DALI lacks refused under --decoder dali; every DALI entry built into a pipeline on
DALI's CPU backend."""

import pytest
import torch

from imagenet_train.loading import dali
from imagenet_train.loading.policies import POLICIES

from conftest import cli, jpeg_bytes

CPU = torch.device("cpu")
NOT_ON_DALI = [str(name) for name, entry in POLICIES.items() if entry.dali is None]


def assert_one_line_exit_2(result, fragment: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("imagenet-train: error: "), result.stderr
    assert fragment in lines[0]


@pytest.mark.parametrize("decoder", ["simplejpeg", "dali"])
@pytest.mark.parametrize("given_by", ["flag", "config"])
def test_an_unknown_policy_is_refused_in_one_line_exit_2_on_both_paths(tmp_path, decoder, given_by):
    if given_by == "flag":
        args = ["--auto-augment", "trivialaugment", "--decoder", decoder]
    else:
        config = tmp_path / "recipe.yaml"
        config.write_text(f"auto_augment: trivialaugment\ndecoder: {decoder}\n")
        args = ["--config", str(config)]
    result = cli("train", "--shards", str(tmp_path / "index.json"), *args)
    assert_one_line_exit_2(result, "expected one of none, ta_wide")
    assert "got 'trivialaugment'" in result.stderr


@pytest.mark.skipif(not dali.available(), reason="NVIDIA DALI not installed (pip install '.[dali]')")
@pytest.mark.parametrize("name", NOT_ON_DALI)
def test_a_policy_dali_lacks_is_refused_in_one_line_exit_2_under_decoder_dali(tmp_path, name):
    result = cli("train", "--shards", str(tmp_path / "index.json"), "--auto-augment", name, "--decoder", "dali")
    assert_one_line_exit_2(result, f"--auto-augment {name}: not available with --decoder dali")


@pytest.mark.skipif(not dali.available(), reason="NVIDIA DALI not installed (pip install '.[dali]')")
@pytest.mark.parametrize("name", [name for name, entry in POLICIES.items() if entry.dali is not None])
def test_every_dali_entry_builds_a_pipeline_on_dalis_cpu_backend(name):
    samples = [(jpeg_bytes(seed=i, size=(64, 48)), i, f"k{i}") for i in range(8)]
    packed = [dali.pack_jpegs([(dali.jpeg_bytes(data), label, key) for data, label, key in samples])]
    augment = dali.DaliAugment(32, normalized=False, auto_augment=name)
    (batch,) = list(dali.DaliDecoder(packed, augment, 8, CPU, threads=1, seed=2))
    images, labels, keys = batch
    assert images.dtype == torch.uint8 and images.shape == (8, 3, 32, 32)
    assert labels.tolist() == list(range(8)) and keys == [key for _, _, key in samples]
