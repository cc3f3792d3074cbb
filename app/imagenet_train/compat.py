"""Make `import torchvision` work where its compiled extension cannot load.

The registry's torchvision wheel is a CUDA build. Next to a CPU-only torch its `_C.so` fails to load
(it links libc10_cuda.so), and torchvision's import then dies registering fake kernels for
`torchvision::nms`/`qnms`, ops that only `_C.so` defines. We declare those op schemas ourselves, only
when the extension cannot load, so models and transforms.v2 work. Detection ops (nms, roi_align) and
`torchvision.io` stay unavailable there; where the extension loads (GPU images, healthy installs),
this does nothing.

`import imagenet_train` installs `TorchvisionFirst`, so a notebook or script that imports the package and then
torchvision gets the shim too, without the package import itself paying for torch.
"""

from __future__ import annotations

import sys

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_state: dict[str, object] = {}


def torchvision_extension_loads() -> bool:
    """Whether torchvision's compiled `_C` extension loads next to this torch."""
    import importlib.util
    from pathlib import Path

    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    for location in spec.submodule_search_locations:
        for library in Path(location).glob("_C*.so"):
            try:
                torch.ops.load_library(str(library))
                return True
            except (OSError, RuntimeError):
                return False
    return False


def ensure_torchvision() -> bool:
    """Prepare torch so `import torchvision` succeeds; returns True when the shim was needed."""
    remove_hook()  # done here once and for all; the hook would run this again inside torchvision_extension_loads
    if "shimmed" in _state:
        return bool(_state["shimmed"])
    import torch

    shimmed = False
    if not torchvision_extension_loads():
        library = torch.library.Library("torchvision", "FRAGMENT")
        for name, schema in _SCHEMAS.items():
            if not _op_exists(name):
                library.define(schema)
        _state["library"] = library  # keep the registration alive
        shimmed = True
    _state["shimmed"] = shimmed
    return shimmed


class TorchvisionFirst:
    """A `sys.meta_path` finder that runs `ensure_torchvision` the first time anything imports torchvision, then
    steps aside (duck-typed: subclassing importlib.abc's would add 20 ms to the package import)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        """Prepare torch for torchvision; the regular finders then find it (this finds nothing itself)."""
        if name == "torchvision":
            ensure_torchvision()  # which takes this hook out first: it looks torchvision up itself
        return None


def install_hook() -> None:
    """Have the first `import torchvision` from now on prepare torch first (torch itself is not imported here)."""
    if "torchvision" not in sys.modules and not any(isinstance(f, TorchvisionFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionFirst())


def remove_hook() -> None:
    """Take the hook out of the import system (once the shim is in place, or known not to be needed)."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, TorchvisionFirst)]


def _op_exists(name: str) -> bool:
    import torch

    try:
        getattr(torch.ops.torchvision, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def require_timm(what: str) -> None:
    """Raise the one-line error naming `what` (a flag) when timm, the optional [timm] extra, does not import."""
    from imagenet_train.errors import ImagenetTrainError

    ensure_torchvision()  # timm imports torchvision
    try:
        import timm.optim  # noqa: F401
    except ImportError:
        raise ImagenetTrainError(f"{what}: needs timm (pip install 'imagenet-train[timm]')") from None
