"""The settings' defaults and limits that the code below the settings uses too (loading/, datasets/, io/), each
with why it is what it is; config.py declares the settings that take them as defaults."""

from __future__ import annotations

CROP_SIZE = 224  # training crop (and evaluation crop unless set apart), in pixels (ResNet-50's ImageNet recipe)
MIN_CROP_SCALE = 0.08  # the smallest area fraction RandomResizedCrop keeps (torchvision's default)
# Corrupt samples in a row that stop a worker (--max-corrupt-streak). Damage is rare and scattered: a tar that
# breaks is a broken shard, not corrupt samples, and a shuffle buffer (or the resampled mode's interleave) spreads
# even a wholly undecodable shard of `shards`' 1,000 samples out. A thousand in a row means nothing decodes: data
# that is not JPEG, or a decoder that cannot work here. At the ~20 us a refused header costs, it is found at once.
MAX_CORRUPT_STREAK = 1000
# Classes an index may list (--max-classes): the classifier head, its gradients and optimizer state grow with
# them on every rank (3 million classes make a ResNet-50 head of 6 GB). ImageNet-21k has 21,841; 100,000 leaves
# room for larger label sets while a head stays under ~1 GB.
MAX_CLASSES = 100_000
# 8192 x 8192 = 64 Mi px: 192 MiB as decoded RGB, the most one image may cost a worker. ImageNet's largest
# images are ~4288 x 2848 (12 MP), so this leaves 5x headroom for other photo datasets.
MAX_IMAGE_PIXELS = 1 << 26
# Seconds of outage (of the shard server or a bucket) to wait out before failing: long enough for a server pod
# to be rescheduled. The default of --io-timeout and of every function that waits.
IO_TIMEOUT = 900.0
# The outage a one-shot command (plan, summarize, evaluate, upload, sync) waits out by default: a person or a
# script is waiting on it, and a server that is gone should cost seconds, not training's 15 minutes. 30 s rides
# out a server's restart (nginx or its container: seconds) with ~5 backed-off attempts (0.5 s doubling); a
# rescheduled pod takes longer, and `--io-timeout 900` waits for one as training does.
ONE_SHOT_IO_TIMEOUT = 30.0
# --collective-timeout's default: the longest the default --loader-timeout lets a rank wait for a batch (an outage
# of IO_TIMEOUT and the read after it), while the others wait in the step's collective (docs/faults.md).
COLLECTIVE_TIMEOUT = 1200.0
