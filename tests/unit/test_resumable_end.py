"""The end of a remote object is its end, however long the reader paused before asking for it: a resampled
worker interleaves several shards, and one shard's pause while another rides out an outage is no stall of the
first one's server (found by make faults: a 60 s outage ended a run in "HTTP 416 Requested Range Not Satisfiable",
a resume asked for from the object's last byte)."""

from __future__ import annotations

import io

import pytest

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import resumable

pytestmark = pytest.mark.unit

PAYLOAD = b"x" * 5000


class Server:
    """Serves PAYLOAD from any byte; asked for a range from its end it answers as nginx does."""

    def __init__(self) -> None:
        self.opened_at: list[int] = []

    def open_at(self, position: int) -> resumable.Opened:
        self.opened_at.append(position)
        if position >= len(PAYLOAD):
            raise ImagenetTrainError("http://127.0.0.1/a.tar: HTTP 416 Requested Range Not Satisfiable")
        return resumable.Opened(io.BytesIO(PAYLOAD[position:]), len(PAYLOAD) - position, len(PAYLOAD))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """resumable's monotonic clock, moved by hand; no real wait between attempts."""
    now = [1000.0]
    monkeypatch.setattr(resumable.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(resumable, "backoff", lambda attempt: 0.0)
    return now


def test_the_end_of_an_object_read_whole_is_the_end_after_a_long_pause(clock) -> None:
    server = Server()
    reader = resumable.ResumableReader("http://127.0.0.1/a.tar", server.open_at, budget=60)
    assert reader.read(len(PAYLOAD)) == PAYLOAD
    clock[0] += 120  # another shard of this worker waited out an outage meanwhile
    assert reader.read(100) == b""
    assert server.opened_at == [0]  # no second connection, no Range from the end


def test_a_connection_broken_after_the_last_byte_is_not_reopened_from_the_end(clock) -> None:
    server = Server()
    reader = resumable.ResumableReader("http://127.0.0.1/a.tar", server.open_at, budget=60)
    assert reader.read(len(PAYLOAD)) == PAYLOAD
    reader._drop()  # what a failed read at the end leaves: no connection, the position at the object's size
    assert reader.read(100) == b""
    assert server.opened_at == [0]


def test_a_pause_mid_object_still_resumes_at_its_byte(clock) -> None:
    server = Server()
    reader = resumable.ResumableReader("http://127.0.0.1/a.tar", server.open_at, budget=60)
    assert reader.read(1000) == PAYLOAD[:1000]
    reader._drop()
    assert reader.read(len(PAYLOAD)) == PAYLOAD[1000:]
    assert server.opened_at == [0, 1000]


def test_each_job_on_a_node_logs_its_first_wait_though_another_logged_within_the_minute(
    tmp_path, monkeypatch, caplog
) -> None:
    """The throttle is per job: two torchrun launches one after the other on a node each say they wait."""
    monkeypatch.setattr(resumable.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(resumable, "backoff", lambda attempt: 0.0)
    for job in ("3f2a-first", "9c1d-second", "9c1d-second"):
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", job)
        resumable.Outage("http://127.0.0.1:9/shard.tar", budget=60).wait(ConnectionRefusedError(111, "refused"))
    assert caplog.text.count("waiting for http://127.0.0.1:9/shard.tar") == 2  # the second job's second wait: quiet


@pytest.mark.parametrize(
    "environment, name",
    [
        ({"TORCHELASTIC_RUN_ID": "none"}, "io-wait-node.stamp"),  # torchrun's default id names no job
        ({"SLURM_JOB_ID": "81", "SLURM_STEP_ID": "2"}, "io-wait-slurm-81.2.stamp"),
        ({"TORCHELASTIC_RUN_ID": "../../etc/x y"}, "io-wait-.._.._etc_x_y.stamp"),  # never a path
    ],
)
def test_the_stamp_is_named_by_the_job_and_never_a_path(monkeypatch, environment, name) -> None:
    for variable in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    assert resumable.wait_stamp_name() == name
