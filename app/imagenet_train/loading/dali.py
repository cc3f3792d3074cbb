"""`--decoder dali`: our loader reads the shards and hands over JPEG bytes; NVIDIA DALI decodes them.

On a GPU the decode is nvJPEG (`device="mixed"`, with the hardware JPEG decoder where the GPU has one),
fused with random-resized-crop, resize, flip and normalisation, and the batch is made on the GPU. Without
a GPU the same pipeline runs on DALI's CPU backend (`device_id=None`). Shard split, resampling, the shard
queue, resume and retries all stay in our loader; only the decode moves.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import get_worker_info

from imagenet_train.choices import AutoAugment, Interpolation
from imagenet_train.datasets.pixels import check_image, decoding
from imagenet_train.errors import ImagenetTrainError
from imagenet_train.imagenet_stats import IMAGENET_MEAN, IMAGENET_STD
from imagenet_train.limits import CROP_SIZE, MAX_IMAGE_PIXELS, MIN_CROP_SCALE
from imagenet_train.loading.batching import Batch
from imagenet_train.loading.policies import dali_builder


def available() -> bool:
    """Whether NVIDIA DALI is installed (pip install 'imagenet-train[dali]')."""
    return importlib.util.find_spec("nvidia.dali") is not None


def jpeg_bytes(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> torch.Tensor:
    """The loader's transform under --decoder dali: the encoded bytes, untouched, as a uint8 tensor.

    DALI decodes in its own pipeline, where one oversize image would fail the whole batch (or exhaust GPU
    memory); so the pixel cap is applied here, in the loader's worker, from the header (~1 us), and an
    oversize image is skipped and counted as a corrupt sample before it ever reaches DALI.
    """
    with decoding():  # a header that does not parse is a corrupt sample too
        check_image(data, max_pixels)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


# A loader batch for DALI: ((every JPEG's bytes end to end, each one's end offset), labels, keys).
JpegBatch = tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, list]


def pack_jpegs(samples: Sequence[tuple]) -> JpegBatch:
    """Batch (encoded bytes, label, key) samples as ((all bytes, end offsets), labels, keys).

    One flat tensor per batch (in shared memory inside a DataLoader worker) instead of a list of byte strings,
    which would be pickled through the worker's pipe.
    """
    sizes = [s[0].numel() for s in samples]
    total = sum(sizes)
    if get_worker_info() is not None:
        flat = torch.empty(0, dtype=torch.uint8)
        flat.set_(flat.untyped_storage()._new_shared(total), 0, (total,), (1,))
    else:
        flat = torch.empty(total, dtype=torch.uint8)
    torch.cat([s[0] for s in samples], out=flat)
    ends = torch.tensor(np.cumsum(sizes), dtype=torch.int64)
    labels = torch.tensor([int(s[1]) for s in samples], dtype=torch.int64)
    return (flat, ends), labels, [s[2] for s in samples]


def unpack_jpegs(packed: tuple[torch.Tensor, torch.Tensor]) -> list[np.ndarray]:
    """The per-sample encoded arrays of a packed batch (views, no copy)."""
    flat, ends = packed
    data = flat.numpy()
    bounds = [0, *ends.tolist()]
    return [data[start:end] for start, end in zip(bounds[:-1], bounds[1:], strict=True)]


@dataclass(frozen=True)
class DaliAugment:
    """What DALI does after the decode: training's random-resized-crop + flip, or evaluation's resize + centre crop."""

    size: int = CROP_SIZE
    train: bool = True
    min_scale: float = MIN_CROP_SCALE
    hflip: bool = True
    resize: int | None = None  # evaluation: short side before the centre crop (default size / 0.875)
    normalized: bool = True  # float32 ImageNet-normalised output; False: uint8 (normalised later)
    auto_augment: AutoAugment | str = AutoAugment.NONE  # training: DALI's own (nvidia.dali.auto_aug) policy
    interpolation: Interpolation | str = Interpolation.BILINEAR  # fn.resize's (the policies keep DALI's own)


class DaliDecoder:
    """Iterate (images, labels, keys) batches decoded by DALI from a loader of packed JPEG batches.

    `device` cuda: images come out on that GPU (float32 normalised, or uint8); cpu: on DALI's CPU backend.
    Each iteration is one pass over `loader` (one epoch of it), at the loader's crop size for that epoch
    (`loader.crop_size`, progressive resizing): the pipeline is rebuilt when that size changes.
    """

    def __init__(
        self,
        loader: Iterable[JpegBatch],
        augment: DaliAugment,
        batch_size: int,
        device: torch.device,
        threads: int = 2,
        seed: int = 0,
        prefetch: int = 2,
    ):
        if not available():
            raise ImagenetTrainError(
                "--decoder dali: NVIDIA DALI is not installed (pip install 'imagenet-train[dali]', "
                "i.e. nvidia-dali-cuda130)"
            )
        if augment.train:
            dali_builder(augment.auto_augment)  # refused here, not inside DALI's graph
        self.loader, self.augment, self.device = loader, augment, device
        self.pending: deque = deque()  # (labels, keys) of batches handed to DALI, in order
        self.batches: Iterator[JpegBatch] | None = None
        self.options = (batch_size, threads, seed, prefetch)
        self.size = augment.size
        self.pipe = self._build(augment, *self.options)

    def _pipe_for_epoch(self):
        """The pipeline at the coming epoch's crop size (the loader's; else the augment's own)."""
        size = getattr(self.loader, "crop_size", 0) or self.augment.size
        if size != self.size:
            del self.pipe  # its threads and buffers go before the next one is made
            batch_size, threads, seed, prefetch = self.options
            # A seed of its own per size: a rebuilt pipeline must not replay the first one's draws.
            augment = dataclasses.replace(self.augment, size=size)
            self.pipe = self._build(augment, batch_size, threads, seed + size, prefetch)
            self.size = size
        return self.pipe

    def _build(self, augment: DaliAugment, batch_size: int, threads: int, seed: int, prefetch: int):
        from nvidia.dali import fn, pipeline_def, types

        gpu = self.device.type == "cuda"
        decode_on = "mixed" if gpu else "cpu"

        @pipeline_def(
            batch_size=batch_size,
            num_threads=max(threads, 1),
            device_id=(self.device.index or 0) if gpu else None,
            seed=seed,
            prefetch_queue_depth=prefetch,
            enable_conditionals=augment.train and augment.auto_augment != AutoAugment.NONE,  # auto_aug needs them
        )
        def pipeline():
            interp = types.INTERP_CUBIC if augment.interpolation == Interpolation.BICUBIC else types.INTERP_LINEAR
            jpegs = fn.external_source(source=self._next_jpegs, batch=True, dtype=types.UINT8, cycle=None)
            if augment.train:
                images = fn.decoders.image_random_crop(
                    jpegs,
                    device=decode_on,
                    output_type=types.RGB,
                    random_area=[augment.min_scale, 1.0],
                    random_aspect_ratio=[3 / 4, 4 / 3],
                    num_attempts=10,
                )
                images = fn.resize(
                    images, resize_x=augment.size, resize_y=augment.size, antialias=True, interp_type=interp
                )
                mirror = fn.random.coin_flip(probability=0.5 if augment.hflip else 0.0)
                if augment.auto_augment != AutoAugment.NONE:
                    # On the crop, before the flip: the policies draw each operation's sign at random,
                    # so the order does not change what they produce.
                    images = dali_policy(augment.auto_augment, images)
                crop = None
            else:
                images = fn.decoders.image(jpegs, device=decode_on, output_type=types.RGB)
                images = fn.resize(
                    images, resize_shorter=augment.resize or round(augment.size / 0.875), interp_type=interp
                )
                mirror, crop = 0, (augment.size, augment.size)
            scale = 255.0 if augment.normalized else None
            return fn.crop_mirror_normalize(
                images,
                crop=crop,
                mirror=mirror,
                dtype=types.FLOAT if augment.normalized else types.UINT8,
                output_layout="CHW",
                mean=[m * scale for m in IMAGENET_MEAN] if scale else [0.0],
                std=[s * scale for s in IMAGENET_STD] if scale else [1.0],
            )

        pipe = pipeline()
        pipe.build()
        return pipe

    def _next_jpegs(self) -> list[np.ndarray]:
        """DALI's source: the next loader batch's JPEGs; its labels and keys wait in order for the output."""
        if self.batches is None:
            raise StopIteration
        packed, labels, keys = next(self.batches)  # StopIteration ends DALI's epoch too
        self.pending.append((labels, keys))
        return unpack_jpegs(packed)

    def __iter__(self) -> Iterator[Batch]:
        from nvidia.dali.plugin.pytorch.torch_utils import to_torch_tensor

        self.pending.clear()
        pipe = self._pipe_for_epoch()
        self.batches = iter(self.loader)
        try:
            while True:
                try:
                    (output,) = pipe.run()
                except StopIteration:
                    return
                images = to_torch_tensor(output.as_tensor(), copy=True)
                labels, keys = self.pending.popleft()
                yield images, labels, keys
        finally:
            self.batches = None
            pipe.reset()


def dali_policy(name: AutoAugment | str, images):
    """DALI's own --auto-augment policy (nvidia.dali.auto_aug, its entry in loading.policies' POLICIES) on a batch
    of uint8 HWC crops; a word the table lacks, or one without a DALI builder, is refused in one line."""
    return dali_builder(name)(images)
