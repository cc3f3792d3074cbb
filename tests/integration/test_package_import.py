"""`import imagenet_train` prepares torchvision for whoever imports it next (a notebook, a user's script), cheaply."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def python(code: str) -> subprocess.CompletedProcess:
    """A fresh interpreter running `code` (the shim is per process: it must come from the package import alone)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_torchvision_imports_after_the_package_in_a_fresh_interpreter():
    code = (
        "import imagenet_train, torchvision, torch\n"
        "model = torchvision.models.get_model('resnet18', num_classes=3)\n"
        "print(tuple(model(torch.zeros(2, 3, 32, 32)).shape))"
    )
    result = python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "(2, 3)"


def test_the_package_import_alone_does_not_load_torch():
    result = python("import sys, imagenet_train; print('torch' in sys.modules, 'torchvision' in sys.modules)")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False", "False"]


def test_the_hook_steps_aside_after_torchvision_imports():
    code = (
        "import sys, imagenet_train, torchvision\n"
        "print(sum(type(f).__name__ == 'TorchvisionFirst' for f in sys.meta_path))"
    )
    result = python(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "0"
