"""Where a fused crop decoder's time goes with libjpeg-turbo 2.1: microseconds per image for each step,
on the benchmark JPEGs, one core. Explains whether cropping/scaling inside the decoder can pay."""

from __future__ import annotations

import time
from pathlib import Path

from turbojpeg import TurboJPEG

RGB = 0


def _us(fn, datas: list[bytes]) -> float:
    for data in datas[:10]:
        fn(data)
    start = time.perf_counter()
    for data in datas:
        fn(data)
    return 1e6 * (time.perf_counter() - start) / len(datas)


def run(images: Path, count: int = 200) -> dict:
    datas = [p.read_bytes() for p in sorted((images / "train").rglob("*.JPEG"))[:count]]
    jpeg = TurboJPEG()
    parts = {
        "header": _us(jpeg.decode_header, datas),
        "lossless crop 224x224 (tjTransform)": _us(lambda d: jpeg.crop(d, 96, 96, 224, 224, copynone=True), datas),
        "decode full size": _us(lambda d: jpeg.decode(d, pixel_format=RGB), datas),
    }
    for n, d in [(7, 8), (3, 4), (5, 8), (1, 2), (1, 4)]:
        parts[f"decode at {n}/{d} scale"] = _us(lambda data, f=(n, d): jpeg.decode(data, RGB, scaling_factor=f), datas)
    cropped = [jpeg.crop(d, 96, 96, 224, 224, copynone=True) for d in datas]
    parts["decode the 224x224 crop"] = _us(lambda d: jpeg.decode(d, pixel_format=RGB), cropped)
    return parts
