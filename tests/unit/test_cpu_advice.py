"""A CPU-only run with the GPU-sized defaults gets one warning line naming the flags to lower; a small one none."""

from __future__ import annotations

import pytest

from imagenet_train.choices import BATCH_SIZE, WORKERS
from imagenet_train.main.train import cpu_advice

pytestmark = pytest.mark.unit


def test_the_defaults_on_a_two_core_cpu_are_told_which_flags_to_lower():
    line = cpu_advice(BATCH_SIZE, WORKERS, cpus=2)
    assert line is not None and "\n" not in line
    assert "--batch-size 256 and --workers 8" in line and "try --batch-size 32 --workers 1" in line
    assert "sized for one GPU of an 8-GPU node" in line


def test_a_small_batch_with_few_workers_gets_no_warning():
    assert cpu_advice(32, 1, cpus=2) is None
    assert cpu_advice(16, 4, cpus=16) is None


def test_a_small_batch_with_more_workers_than_cores_is_still_told():
    assert "--workers 3" in cpu_advice(8, 8, cpus=4)
