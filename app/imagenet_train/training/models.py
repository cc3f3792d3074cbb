"""The model a run trains: a torchvision or timm architecture by name, its residual-BN zero-init, a stem for small
images, FFCV's BlurPool, and its initial weights from a file (`--weights`)."""

from __future__ import annotations

import difflib
from collections import OrderedDict
from pathlib import Path

import torch

from imagenet_train.choices import DEFAULT_DROP_PATH, Stem, WeightsHead
from imagenet_train.compat import ensure_torchvision
from imagenet_train.config import RunConfig
from imagenet_train.errors import ImagenetTrainError, clip
from imagenet_train.weights_files import load_weights

TIMM = "timm/"  # --arch timm/NAME picks timm's model NAME
TIMM_INSTALL = "pip install 'imagenet-train[timm]'"
BLUR_MIN_CHANNELS = 16  # FFCV blurs strided convolutions with at least this many input channels
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP's and torch.compile's wrappers, in saved state dicts


def create(run: RunConfig, num_classes: int, is_main: bool = True) -> torch.nn.Module:
    """The run's model, on the CPU and ready for the device: built, zero-inited, blurred, and loaded from --weights.

    Every rank loads --weights itself, before DDP wraps the model: each reaches the same verdict on the same
    file (a bad file stops every rank with the same line, none is left waiting in DDP's broadcast), as
    --resume does, and it holds under launchers whose strategy does not broadcast. --resume, applied after
    this, replaces every tensor, so a resumed run keeps its checkpoint's weights.
    """
    model = architecture(run, num_classes)
    if run.weights:
        note = load_into(model, run.weights, WeightsHead(run.weights_head))
        if note and is_main:
            print(note, flush=True)
    return model


def architecture(run: RunConfig, num_classes: int) -> torch.nn.Module:
    """The run's network before any weights are loaded: --arch, zero-inited as asked, with --blurpool's layers
    (so a checkpoint of a blurred model loads into it)."""
    model = build_model(run.arch, num_classes, run.zero_init_residual, run.drop_path, run.resnet_width)
    if Stem(run.stem) == Stem.SMALL:
        apply_small_stem(model, run.arch)
    if run.blurpool:
        apply_blurpool(model, run.arch)
    return model


def build_model(
    arch: str,
    num_classes: int,
    zero_init_residual: bool = False,
    drop_path: float = DEFAULT_DROP_PATH,
    resnet_width: int = 0,
) -> torch.nn.Module:
    """A torchvision model by name, or timm's as `timm/NAME`, randomly initialised for `num_classes`, with the
    library's own defaults except where `zero_init_residual` (on), `drop_path` (>= 0) or `resnet_width` (> 0,
    timm's ResNets) say otherwise."""
    ensure_torchvision()  # before timm too: timm imports torchvision
    if resnet_width:
        return _narrow_timm_resnet(arch, num_classes, _timm_options(zero_init_residual, drop_path), resnet_width)
    if arch.startswith(TIMM):
        model = _timm_model(arch, num_classes, zero_init_residual, drop_path)
    else:
        model = _torchvision_model(arch, num_classes, zero_init_residual, drop_path)
    if zero_init_residual and not _zeroed_norms(model):  # a model that took the keyword and did nothing with it
        raise _no_zero_init(arch)
    return model


def _torchvision_model(arch: str, num_classes: int, zero_init_residual: bool, drop_path: float) -> torch.nn.Module:
    import torchvision

    if arch not in torchvision.models.list_models(module=torchvision.models):
        raise ImagenetTrainError(
            f"--arch: unknown model '{clip(arch)}' (torchvision has e.g. resnet18, resnet50; timm's are timm/NAME)"
        )
    options: dict[str, object] = {}
    if zero_init_residual:
        # torchvision's ResNet family (resnet, resnext, wide_resnet) takes zero_init_residual; the rest do not.
        if torchvision.models.get_model_builder(arch).__module__ != "torchvision.models.resnet":
            raise _no_zero_init(arch)
        options["zero_init_residual"] = True
    if drop_path != DEFAULT_DROP_PATH:
        options["stochastic_depth_prob"] = drop_path
    try:
        return torchvision.models.get_model(arch, weights=None, num_classes=num_classes, **options)
    except TypeError as error:
        if "stochastic_depth_prob" not in str(error):
            raise
    # ResNet and ViT have no such keyword; Swin's and MaxViT's builders fix it (torchvision's train.py cannot set
    # it either); EfficientNet and ConvNeXt take it.
    raise ImagenetTrainError(
        f"--drop-path: torchvision's {clip(arch)} takes no stochastic_depth_prob; expected --drop-path -1"
    )


def _timm_model(arch: str, num_classes: int, zero_init_residual: bool, drop_path: float) -> torch.nn.Module:
    timm = _timm(f"--arch {clip(arch)}")
    name = arch.removeprefix(TIMM)
    if not timm.is_model(name):
        near = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join(TIMM + n for n in near)}?" if near else "; timm.list_models() lists them"
        raise ImagenetTrainError(f"--arch: timm has no model '{clip(name)}'{hint}")
    # Only what a setting says outright is passed: everything else keeps timm's default, as timm's train.py
    # (zero_init_last, on for its ResNets; drop_path_rate 0).
    options = _timm_options(zero_init_residual, drop_path)
    try:
        return timm.create_model(name, pretrained=False, num_classes=num_classes, **options)
    except TypeError as error:
        taken = next((key for key in options if key in str(error)), None)
        if taken is None:
            raise
    if taken == "zero_init_last":  # the model has no such keyword, or its entry point fixes it
        raise _no_zero_init(arch)
    raise ImagenetTrainError(f"--drop-path: timm's {clip(name)} takes no drop_path_rate; expected --drop-path -1")


def _timm_options(zero_init_residual: bool, drop_path: float) -> dict:
    """The create_model keywords the settings say outright (timm's hook for zero-init: zero_init_last, on ResNet,
    RegNet, CSPNet, ByobNet, ResNetV2, which calls each residual block's own zero-init)."""
    options: dict = {"zero_init_last": True} if zero_init_residual else {}
    if drop_path != DEFAULT_DROP_PATH:
        options["drop_path_rate"] = drop_path
    return options


def _narrow_timm_resnet(arch: str, num_classes: int, options: dict, width: int) -> torch.nn.Module:
    """A timm ResNet with `width` channels in its first stage, doubling per stage (timm's `channels` keyword)."""
    timm = _timm(f"--resnet-width {width}")
    name = arch.removeprefix(TIMM)
    module = timm.models.model_entrypoint(name).__module__ if timm.is_model(name) else ""
    if not arch.startswith(TIMM) or module != "timm.models.resnet":
        raise ImagenetTrainError(
            f"--resnet-width {width}: applies to timm's ResNets (--arch timm/resnet18, timm/resnet10t), "
            f"not --arch {clip(arch)}; expected --resnet-width 0"
        )
    channels = tuple(width * 2**stage for stage in range(4))
    return timm.create_model(name, pretrained=False, num_classes=num_classes, channels=channels, **options)


def _timm(wanted: str):
    """The timm module, or the one line saying how to install it."""
    try:
        import timm
    except ImportError:
        raise ImagenetTrainError(f"{wanted}: needs timm ({TIMM_INSTALL})") from None
    return timm


def _zeroed_norms(model: torch.nn.Module) -> int:
    """How many normalisation layers have all-zero scales."""
    norms = (torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm, torch.nn.LayerNorm)
    return sum(
        1
        for m in model.modules()
        if isinstance(m, norms) and getattr(m, "weight", None) is not None and not m.weight.detach().any()
    )


def _no_zero_init(arch: str) -> ImagenetTrainError:
    return ImagenetTrainError(
        f"--zero-init-residual: does not apply to --arch {clip(arch)} (torchvision's ResNet family and timm models "
        "with zero_init_last have a last BN per residual block to zero); expected --no-zero-init-residual"
    )


def apply_small_stem(model: torch.nn.Module, arch: str = "") -> torch.nn.Module:
    """A ResNet's stem for small images, in place: `conv1` becomes a 3x3 stride-1 convolution to the same width
    and `maxpool` an identity, so a 32 px image reaches the first block at 32x32 rather than 8x8.

    torchvision's and timm's ResNets name their stem alike (conv1, bn1, maxpool); timm's deep stems (a Sequential
    conv1) are replaced whole. The new convolution is initialised as torchvision initialises its own.
    """
    conv, norm = getattr(model, "conv1", None), getattr(model, "bn1", None)
    first = conv[0] if isinstance(conv, torch.nn.Sequential) and len(conv) else conv
    width = getattr(norm, "num_features", None)
    if not (isinstance(first, torch.nn.Conv2d) and isinstance(width, int) and hasattr(model, "maxpool")):
        raise ImagenetTrainError(
            f"--stem small: --arch {clip(arch)} has no ResNet stem (conv1, bn1, maxpool) to replace; it applies to "
            "torchvision's ResNet family and timm's ResNets; expected --stem imagenet"
        )
    small = torch.nn.Conv2d(first.in_channels, width, kernel_size=3, stride=1, padding=1, bias=False)
    torch.nn.init.kaiming_normal_(small.weight, mode="fan_out", nonlinearity="relu")
    model.conv1 = small
    model.maxpool = torch.nn.Identity()
    return model


def apply_blurpool(model: torch.nn.Module, arch: str = "") -> int:
    """FFCV's BlurPool: a stride-1 binomial blur before every strided convolution with >= 16 input channels.

    Each such convolution becomes `Sequential(blur, conv)`, so its weights are saved as `NAME.conv.weight`:
    weights trained with and without BlurPool are different networks and do not load into each other.
    Returns how many convolutions it blurred.
    """
    blur_pool = _timm("--blurpool").layers.BlurPool2d
    blurred = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _strided_conv(child):
                # Zero padding and stride 1 as FFCV's blur; the original convolution then strides.
                blur = blur_pool(child.in_channels, filt_size=3, stride=1, pad_mode="constant")
                setattr(parent, name, torch.nn.Sequential(OrderedDict(blur=blur, conv=child)))
                blurred += 1
    if not blurred:
        raise ImagenetTrainError(
            f"--blurpool: --arch {clip(arch)} has no strided convolution with {BLUR_MIN_CHANNELS} or more input "
            "channels to blur; expected --no-blurpool"
        )
    return blurred


def _strided_conv(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Conv2d) and max(module.stride) > 1 and module.in_channels >= BLUR_MIN_CHANNELS


def load_into(model: torch.nn.Module, path: str | Path, head: WeightsHead = WeightsHead.REFUSE) -> str:
    """Load --weights into `model` exactly; returns the line to print when the head was left fresh, else ''."""
    state = strip_wrappers(load_weights(path))
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = {k: (tuple(state[k].shape), tuple(v.shape)) for k, v in expected.items() if k in state}
    misshaped = [k for k, (theirs, ours) in shapes.items() if theirs != ours]
    classes = _classes(model)
    heads = [k for k in misshaped if _head_only(*shapes[k], classes)]
    others = [f"missing {k}" for k in missing] + [f"unexpected {k}" for k in unexpected]
    others += [f"{k} is {_shape(shapes[k][0])} not {_shape(shapes[k][1])}" for k in misshaped if k not in heads]
    if others:
        more = f" (and {len(others) - 3} more)" if len(others) > 3 else ""
        raise ImagenetTrainError(f"--weights {path}: does not fit this model: {'; '.join(others[:3])}{more}")
    if heads and head != WeightsHead.REPLACE:
        theirs, ours = shapes[heads[0]]
        raise ImagenetTrainError(
            f"--weights {path}: the head {heads[0]} is {_shape(theirs)} in the file but {_shape(ours)} here "
            f"({ours[0]} classes); --weights-head replace loads the rest and trains a new head"
        )
    for key in heads:
        del state[key]
    model.load_state_dict(state, strict=not heads)
    if not heads:
        return ""
    theirs, ours = shapes[heads[0]]
    return (
        f"--weights {path}: loaded {len(state)} tensors; the head ({', '.join(heads)}) is freshly initialised for "
        f"{ours[0]} classes (the file's has {theirs[0]})"
    )


def strip_wrappers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict without DDP's `module.` and torch.compile's `_orig_mod.` prefixes, in any nesting."""
    stripped = True
    while stripped:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if all(key.startswith(prefix) for key in state):  # all, or a submodule named `module` would lose it
                state = {key.removeprefix(prefix): value for key, value in state.items()}
                stripped = True
    return state


def _classes(model: torch.nn.Module) -> int | None:
    """The model's class count: its classifier's output size (timm's and torchvision's heads alike)."""
    getter = getattr(model, "get_classifier", None)  # timm
    head = getter() if callable(getter) else None
    if isinstance(head, torch.nn.Linear):
        return head.out_features
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return linears[-1].out_features if linears else None


def _head_only(theirs: tuple, ours: tuple, classes: int | None) -> bool:
    """Whether a shape differs only in the class count: the classifier of another dataset."""
    return bool(ours) and len(theirs) == len(ours) and ours[0] == classes and theirs[1:] == ours[1:]


def _shape(shape: tuple) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"
