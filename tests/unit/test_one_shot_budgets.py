"""Which --io-timeout each command starts from: a short one for the commands a person waits on, training's for
the jobs that ride out outages."""

import pytest

from imagenet_train.cli import build_parser
from imagenet_train.limits import IO_TIMEOUT, ONE_SHOT_IO_TIMEOUT

pytestmark = pytest.mark.unit

ONE_SHOT = {
    "plan": ["plan", "--shards", "http://127.0.0.1:1/shards.json"],
    "summarize": ["summarize", "http://127.0.0.1:1/shards.json"],
    "evaluate": ["evaluate", "weights.pt", "--shards", "http://127.0.0.1:1/shards.json"],
    "upload": ["upload", "run", "gs://bucket/run"],
    "sync": ["sync", "gs://bucket/run", "run"],
}


@pytest.mark.parametrize("command", sorted(ONE_SHOT))
def test_a_one_shot_command_waits_out_a_short_outage_by_default(command):
    assert build_parser().parse_args(ONE_SHOT[command]).io_timeout == ONE_SHOT_IO_TIMEOUT <= 60


@pytest.mark.parametrize("command", sorted(ONE_SHOT))
def test_a_one_shot_command_takes_io_timeout(command):
    assert build_parser().parse_args([*ONE_SHOT[command], "--io-timeout", "7"]).io_timeout == 7


def test_the_charts_fill_job_rides_out_outages_as_training_does():
    assert build_parser().parse_args(["fill", "--deployment", "d.yaml"]).io_timeout == IO_TIMEOUT
