"""The --auto-augment table (loading.policies.POLICIES): one entry per enum member, read by the CPU path, the DALI
path and the config checks; a word it lacks, or one DALI lacks under --decoder dali, refused in one line."""

import re
from pathlib import Path

import pytest
import torch

from imagenet_train.choices import AutoAugment
from imagenet_train.cli import build_parser
from imagenet_train.commands.train_cmd import _config_from
from imagenet_train.config import AugmentConfig
from imagenet_train.declarations import declared
from imagenet_train.loading import dali, policies
from imagenet_train.loading.augment import after_crop, policy
from imagenet_train.loading.policies import POLICIES, Policy
from imagenet_train.loading.presets import TrainPreset
from imagenet_train.main.entry_checks import runnable

from conftest import jpeg_bytes, refusal

pytestmark = pytest.mark.unit


def config_of(*flags: str):
    return _config_from(build_parser().parse_args(["train", "--shards", "x", *flags]))


def test_every_enum_member_has_one_table_entry_and_the_setting_offers_exactly_the_table():
    assert list(POLICIES) == list(AutoAugment)
    (rule,) = [rule for declaration, rule in declared(AugmentConfig) if declaration.name == "auto_augment"]
    assert rule.choices == tuple(str(name) for name in POLICIES)


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_every_table_entry_builds_on_the_cpu_path_and_keeps_uint8_chw_crops(name, interpolation):
    torch.manual_seed(0)
    built = policy(name, interpolation)
    assert (built is None) == (POLICIES[name].cpu is None)
    data = jpeg_bytes(seed=4, size=(96, 80))
    transform = TrainPreset(48, auto_augment=name, interpolation=interpolation).build()
    for _ in range(5):
        crop = transform(data)
        assert crop.dtype == torch.uint8 and crop.shape == (3, 48, 48)


@pytest.mark.parametrize("name", [name for name, entry in POLICIES.items() if entry.dali is not None])
def test_the_dali_path_builds_each_policy_from_its_table_entry(name, monkeypatch):
    seen = []
    monkeypatch.setitem(POLICIES, name, Policy(cpu=POLICIES[name].cpu, dali=lambda images: seen.append(images) or 7))
    images = object()
    assert dali.dali_policy(name, images) == 7 and seen == [images]


def test_the_dali_module_names_no_policy_of_its_own():
    # Its only policy word is `none` (no auto_aug graph, no conditionals); every other one comes from the table.
    source = Path(dali.__file__).read_text()
    named = set(re.findall(r"AutoAugment\.([A-Z_]+)", source))
    assert named <= {"NONE"}, named
    assert "import auto_augment" not in source and "from nvidia.dali.auto_aug" not in source


@pytest.mark.parametrize("name", ["bogus", "ta", "AutoAugment", "TA_WIDE", ""])
def test_a_word_the_table_lacks_is_refused_in_one_line_on_both_paths(name):
    expected = f"--auto-augment: expected one of {', '.join(str(member) for member in POLICIES)}, got '{name}'"
    assert refusal(lambda: policy(name)) == expected
    assert refusal(lambda: after_crop(name, 0.0)) == expected
    assert refusal(lambda: TrainPreset(48, auto_augment=name).build()) == expected
    assert refusal(lambda: dali.dali_policy(name, object())) == expected
    assert refusal(lambda: dali.DaliDecoder([], dali.DaliAugment(32, auto_augment=name), 4, torch.device("cpu")))


def test_an_enum_member_without_an_entry_is_refused_when_the_settings_are_read(monkeypatch):
    monkeypatch.delitem(POLICIES, AutoAugment.RA)
    message = refusal(lambda: runnable(config_of("--auto-augment", "ra")))
    assert message == f"--auto-augment: expected one of {', '.join(str(name) for name in POLICIES)}, got 'ra'"
    assert AutoAugment.RA not in POLICIES  # the words offered are what is left in the table


def test_a_policy_without_a_dali_builder_is_refused_in_one_line_under_decoder_dali(monkeypatch):
    monkeypatch.setitem(POLICIES, AutoAugment.RA, Policy(cpu=POLICIES[AutoAugment.RA].cpu, dali=None))
    assert runnable(config_of("--auto-augment", "ra")).augment.auto_augment == "ra"  # the CPU path keeps it
    if not dali.available():
        pytest.skip("NVIDIA DALI not installed: --decoder dali is refused before the policy")
    message = refusal(lambda: runnable(config_of("--auto-augment", "ra", "--decoder", "dali")))
    assert message.startswith("--auto-augment ra: not available with --decoder dali")
    assert refusal(lambda: dali.dali_policy("ra", object())) == message


def test_the_table_imports_neither_torch_nor_dali_so_the_config_checks_stay_light():
    source = Path(policies.__file__).read_text()
    assert not re.search(r"^(import|from) (torch|torchvision|nvidia)", source, re.MULTILINE)
