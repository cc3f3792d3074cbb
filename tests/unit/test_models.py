"""The run's model: torchvision and timm architectures, residual-BN zero-init, BlurPool, and --weights."""

from __future__ import annotations

import sys

import pytest
import torch

from imagenet_train.choices import WeightsHead
from imagenet_train.compat import ensure_torchvision
from imagenet_train.config import RunConfig
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.training import models

ensure_torchvision()
import timm  # noqa: E402
import torchvision  # noqa: E402

pytestmark = pytest.mark.unit


def _one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


def test_timm_arch_builds_timms_model_for_the_class_count():
    model = models.build_model("timm/resnet18d", 10)
    assert isinstance(model, timm.models.ResNet)
    assert model.get_classifier().out_features == 10
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_unknown_timm_name_is_one_line_with_suggestions():
    with pytest.raises(ImagenetTrainError) as error:
        models.build_model("timm/resnt50d", 10)
    assert _one_line(error).startswith("--arch: timm has no model 'resnt50d'")
    assert "timm/resnet50d" in str(error.value)


def test_timm_arch_without_timm_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # what `import timm` meets where it is not installed
    with pytest.raises(ImagenetTrainError) as error:
        models.build_model("timm/resnet18d", 10)
    assert _one_line(error) == "--arch timm/resnet18d: needs timm (pip install 'imagenet-train[timm]')"
    with pytest.raises(ImagenetTrainError, match=r"^--blurpool: needs timm \(pip install"):
        models.apply_blurpool(models.build_model("resnet18", 10), "resnet18")


def _last_bns(model: torch.nn.Module) -> list[torch.Tensor]:
    """The last BN's scale in every residual block, torchvision's and timm's."""
    blocks = (
        torchvision.models.resnet.BasicBlock,
        torchvision.models.resnet.Bottleneck,
        timm.models.resnet.BasicBlock,
        timm.models.resnet.Bottleneck,
    )
    found = []
    for module in model.modules():
        if isinstance(module, blocks):
            found.append((module.bn3 if hasattr(module, "bn3") else module.bn2).weight.detach())
    assert found
    return found


@pytest.mark.parametrize("arch", ["resnet18", "resnet50", "timm/resnet18d", "timm/resnet50d"])
def test_zero_init_residual_zeroes_the_last_bn_of_every_block_only(arch):
    zeroed = models.build_model(arch, 10, zero_init_residual=True)
    assert all(not gamma.any() for gamma in _last_bns(zeroed))
    assert zeroed.bn1.weight.detach().all()  # the stem's BN keeps its scale of one


@pytest.mark.parametrize(("arch", "zeroed_by_default"), [("resnet18", False), ("timm/resnet18d", True)])
def test_without_zero_init_residual_each_library_keeps_its_own_default(arch, zeroed_by_default):
    # torchvision's ResNet starts with unit scales; timm's create_model zero-inits its ResNets (zero_init_last).
    plain = models.build_model(arch, 10)
    assert all(not gamma.any() if zeroed_by_default else gamma.all() for gamma in _last_bns(plain))


@pytest.mark.parametrize("arch", ["vgg11", "timm/test_vit"])
def test_zero_init_residual_on_an_arch_without_residual_bn_is_one_line(arch):
    with pytest.raises(ImagenetTrainError) as error:
        models.build_model(arch, 10, zero_init_residual=True)
    assert _one_line(error).startswith(f"--zero-init-residual: does not apply to --arch {arch}")


def _strided(model: torch.nn.Module) -> list[tuple[str, torch.nn.Conv2d]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Conv2d) and max(m.stride) > 1]


@pytest.mark.parametrize("arch", ["resnet18", "timm/resnet18d"])
def test_blurpool_blurs_before_each_strided_conv_with_16_or_more_channels(arch):
    model = models.build_model(arch, 10)
    wanted = {name for name, conv in _strided(model) if conv.in_channels >= 16}
    assert wanted and len(wanted) < len(_strided(model))  # the RGB stem stays unblurred
    assert models.apply_blurpool(model, arch) == len(wanted)
    blurred = {name.removesuffix(".conv") for name, conv in _strided(model) if conv.in_channels >= 16}
    assert blurred == wanted
    modules = dict(model.named_modules())
    for name in wanted:
        pair = modules[name]
        assert list(pair._modules) == ["blur", "conv"]
        assert isinstance(pair.blur, timm.layers.BlurPool2d) and pair.blur.stride == 1
    for name, _ in _strided(model):
        if not name.endswith(".conv"):
            assert not isinstance(modules.get(name.rsplit(".", 1)[0] + ".blur"), timm.layers.BlurPool2d)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_blurpool_is_ffcvs_zero_padded_binomial_blur():
    model = models.build_model("resnet18", 10)
    models.apply_blurpool(model, "resnet18")
    blur = model.layer2[0].conv1.blur
    out = blur(torch.ones(1, 64, 8, 8))
    assert torch.allclose(out[0, :, 3, 3], torch.ones(64))  # the [1 2 1]/4 filter in both directions sums to 1
    assert torch.allclose(out[0, :, 0, 0], torch.full((64,), 9 / 16))  # zero padding, not reflection


def test_blurpool_on_an_arch_without_such_convs_is_one_line():
    with pytest.raises(ImagenetTrainError) as error:
        models.apply_blurpool(models.build_model("timm/test_vit", 10), "timm/test_vit")
    assert _one_line(error).startswith("--blurpool: --arch timm/test_vit has no strided convolution")


def _saved(tmp_path, state: dict, name: str = "weights.pt"):
    path = tmp_path / name
    torch.save(state, path)
    return path


def _source(classes: int = 10, arch: str = "resnet18") -> torch.nn.Module:
    torch.manual_seed(123)  # other weights than a model built under the run's seed
    return models.build_model(arch, classes)


def _run(path, head: WeightsHead = WeightsHead.REFUSE, arch: str = "resnet18") -> RunConfig:
    return RunConfig(arch=arch, weights=str(path), weights_head=head.value)


@pytest.mark.parametrize("prefix", ["", "module.", "_orig_mod.", "_orig_mod.module.", "module._orig_mod."], ids=repr)
def test_weights_load_a_state_dict_exactly_without_wrapper_prefixes(tmp_path, prefix):
    source = _source().state_dict()
    path = _saved(tmp_path, {prefix + key: value for key, value in source.items()})
    torch.manual_seed(0)
    loaded = models.create(_run(path), 10).state_dict()
    assert loaded.keys() == source.keys()
    assert all(torch.equal(loaded[key], source[key]) for key in source)


def test_weights_load_from_one_of_our_checkpoints(tmp_path):
    source = _source().state_dict()
    path = _saved(tmp_path, {"epoch": 3, "model": source, "optimizer": {}, "scaler": {}})
    loaded = models.create(_run(path), 10).state_dict()
    assert all(torch.equal(loaded[key], source[key]) for key in source)


@pytest.mark.parametrize("arch", ["timm/resnet18d", "timm/test_vit"])
def test_weights_load_a_timm_state_dict_exactly(tmp_path, arch):
    source = _source(arch=arch).state_dict()
    loaded = models.create(_run(_saved(tmp_path, source), arch=arch), 10).state_dict()
    assert all(torch.equal(loaded[key], source[key]) for key in source)


def test_weights_head_replace_loads_the_rest_and_keeps_a_fresh_head(tmp_path, capsys):
    source = _source(classes=1000).state_dict()
    path = _saved(tmp_path, source)
    torch.manual_seed(0)
    fresh = models.build_model("resnet18", 10).state_dict()
    torch.manual_seed(0)
    loaded = models.create(_run(path, WeightsHead.REPLACE), 10).state_dict()
    for key in source:
        if key.startswith("fc."):
            assert torch.equal(loaded[key], fresh[key]) and loaded[key].shape[0] == 10
        else:
            assert torch.equal(loaded[key], source[key]), key
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        f"--weights {path}: loaded 120 tensors; the head (fc.weight, fc.bias) is freshly initialised for 10 "
        "classes (the file's has 1000)"
    ]
    models.create(_run(path, WeightsHead.REPLACE), 10, is_main=False)
    assert capsys.readouterr().out == ""  # the line comes from rank 0 only


def test_weights_head_of_another_size_is_refused_by_default(tmp_path):
    path = _saved(tmp_path, _source(classes=1000).state_dict())
    with pytest.raises(ImagenetTrainError) as error:
        models.create(_run(path), 10)
    assert _one_line(error) == (
        f"--weights {path}: the head fc.weight is [1000, 512] in the file but [10, 512] here (10 classes); "
        "--weights-head replace loads the rest and trains a new head"
    )


def test_weights_of_another_model_name_up_to_three_keys(tmp_path):
    path = _saved(tmp_path, _source(arch="resnet34").state_dict())
    with pytest.raises(ImagenetTrainError) as error:
        models.create(_run(path, WeightsHead.REPLACE), 10)
    text = _one_line(error)
    assert text.startswith(f"--weights {path}: does not fit this model: unexpected layer1.2.conv1.weight; ")
    assert text.count("unexpected ") == 3 and "more)" in text


def test_weights_of_a_blurpool_run_do_not_load_into_a_plain_model(tmp_path):
    blurred = _source()
    models.apply_blurpool(blurred, "resnet18")
    path = _saved(tmp_path, blurred.state_dict())
    with pytest.raises(ImagenetTrainError, match=r"does not fit this model: missing layer2\.0\.conv1\.weight"):
        models.create(_run(path), 10)
    run = _run(path)
    run.blurpool = True
    loaded = models.create(run, 10).state_dict()
    assert all(torch.equal(loaded[key], value) for key, value in blurred.state_dict().items())
