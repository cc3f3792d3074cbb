#!/usr/bin/env python3
"""Split the image's requirements against what the base image already has installed.

Writes `constraints.txt` (every installed distribution at its installed version, so nothing the base
ships, torch above all, is upgraded or replaced) and `requirements.txt` (the pinned requirements the
base lacks). Usage: pins.py REQUIREMENTS OUTDIR
"""

import re
import sys
from importlib import metadata
from pathlib import Path


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> None:
    requirements, outdir = Path(sys.argv[1]), Path(sys.argv[2])
    installed = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
    # Local versions (torch 2.6.0a0+ecf3bae, 2.13.0+cpu) are valid pins: `==` matches them exactly.
    constraints = [f"{name}=={version}" for name, version in sorted(installed.items())]
    wanted = []
    for line in requirements.read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if spec and canonical(re.split(r"[=<>!~ \[]", spec, maxsplit=1)[0]) not in installed:
            wanted.append(spec)
    (outdir / "constraints.txt").write_text("\n".join(constraints) + "\n")
    (outdir / "requirements.txt").write_text("\n".join(wanted) + "\n")
    print(f"pins: {len(constraints)} base packages held, {len(wanted)} to install: {' '.join(wanted)}")


if __name__ == "__main__":
    main()
