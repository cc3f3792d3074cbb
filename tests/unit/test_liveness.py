"""--collective-timeout: its default against the waits it must outlast, the one line naming the rank that stopped
answering (from heartbeats in the job's store), and NCCL's watchdog and flight recorder switched on for GPUs.
The real timeout: tests/integration/test_hung_rank.py (a gloo world), tests/faults/test_hung_rank.py (torchrun)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from imagenet_train.config import Config
from imagenet_train.config_checks import checked
from imagenet_train.errors import RETRY_EXIT, ImagenetTrainError
from imagenet_train.limits import COLLECTIVE_TIMEOUT, IO_TIMEOUT
from imagenet_train.training.dist import FLIGHT_RECORDER, is_collective_timeout, nccl_environment
from imagenet_train.training.liveness import Beat, Heartbeat, hang_message, interval_s, silent

pytestmark = pytest.mark.unit

GLOO_TIMEOUT = RuntimeError(
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 20000ms "
    "for recv operation to complete"
)


def beats(**counts: int) -> dict[int, Beat]:
    return {int(name[1:]): Beat(count, f"node-{name[1:]}", 100 + int(name[1:])) for name, count in counts.items()}


def test_the_default_outlasts_the_longest_wait_for_a_batch_and_is_under_the_old_half_hour():
    defaults = Config()
    assert defaults.run.collective_timeout == COLLECTIVE_TIMEOUT < 30 * 60
    assert COLLECTIVE_TIMEOUT >= defaults.loader.loader_timeout > IO_TIMEOUT
    defaults.data.shards = "shards.json"
    checked(defaults)


def test_a_timeout_shorter_than_the_wait_for_a_batch_is_refused_naming_both_flags():
    cfg = Config()
    cfg.data.shards, cfg.run.collective_timeout = "shards.json", 600
    with pytest.raises(ImagenetTrainError, match=r"^--collective-timeout: 600 s would end the run .*--loader-timeout"):
        checked(cfg)
    cfg.loader.io_timeout, cfg.loader.loader_timeout = 300, 500  # lowered together: a 10-minute limit is fine
    checked(cfg)
    cfg.loader.loader_timeout = 0  # the loader waits forever: the outage's own budget is the bound
    cfg.loader.io_timeout = 900
    with pytest.raises(ImagenetTrainError, match=r"--io-timeout 900 s\) and the others wait"):
        checked(cfg)


def test_the_rank_whose_heartbeat_stopped_is_named_with_its_host_and_pid():
    before, after = beats(r0=5, r1=5, r2=5, r3=5), beats(r0=7, r1=5, r2=8, r3=7)
    assert silent(before, after, me=0) == [1]
    line = hang_message(0, 20, before, after, RETRY_EXIT)
    assert line.startswith("rank 0: no collective finished within --collective-timeout 20 s: ")
    assert "rank 1 on host node-1 (pid 101) stopped answering" in line
    assert "rank 2" not in line and "rank 3" not in line and f"exit {RETRY_EXIT}" in line
    assert "\n" not in line


def test_the_asking_rank_never_names_itself_even_when_its_own_beat_is_late():
    assert silent(beats(r0=3, r1=3), beats(r0=3, r1=4), me=0) == []


def test_when_every_rank_still_beats_no_rank_is_blamed():
    line = hang_message(1, 1200, beats(r0=1, r1=1), beats(r0=2, r1=2), RETRY_EXIT)
    assert "every rank still answers" in line and "stopped answering" not in line


def test_a_store_that_did_not_answer_is_said_instead_of_blaming_a_rank():
    assert "store did not answer" in hang_message(1, 60, {}, {}, RETRY_EXIT)


def test_beats_come_forty_times_per_timeout_within_half_a_second_and_thirty_seconds():
    assert interval_s(20) == 0.5 and interval_s(200) == 5.0 and interval_s(COLLECTIVE_TIMEOUT) == 30.0
    assert interval_s(10) == 0.5 and interval_s(86400) == 30.0


def test_a_beat_survives_the_store_and_an_unreadable_one_counts_as_never_beating():
    beat = Beat(12, "host with spaces", 4242)
    assert Beat.decode(beat.encode().encode()) == beat  # the store hands back bytes
    assert Beat.decode(b"\xff garbage").count == -1


def test_who_stopped_reads_the_store_twice_and_names_the_rank_that_did_not_beat_meanwhile():
    store = dist.HashStore()
    ranks = [Heartbeat(rank, 3, 20, store=store) for rank in range(3)]
    for beat in ranks:
        beat._beat()  # what start() publishes first, without the thread

    def others_beat_but_rank_2(_seconds: float) -> None:
        ranks[0]._beat()
        ranks[1]._beat()

    line = ranks[0].who_stopped(RETRY_EXIT, 20, wait=others_beat_but_rank_2)
    assert f"rank 2 on host {ranks[2].host} (pid {ranks[2].pid}) stopped answering" in line, line
    assert "rank 1 on" not in line


def test_gloos_timeout_is_a_collective_timeout_and_a_reset_connection_is_not():
    assert is_collective_timeout(GLOO_TIMEOUT)
    assert not is_collective_timeout(RuntimeError("[../gloo/transport/tcp/pair.cc:537] Connection reset by peer"))
    assert not is_collective_timeout(RuntimeError("CUDA error: an illegal memory access (timeout unrelated)"))
    assert is_collective_timeout(dist.DistBackendError("Watchdog caught collective operation timeout"))


def test_nccl_watchdog_heartbeat_and_flight_recorder_are_switched_on_with_dumps_in_the_run_directory(tmp_path):
    env: dict[str, str] = {}
    chosen = nccl_environment(env, 300, str(tmp_path / "run"))
    assert chosen == env
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and env["TORCH_NCCL_ENABLE_MONITORING"] == "1"
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "300" and int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"{tmp_path / 'run' / FLIGHT_RECORDER}/rank-"
    assert (tmp_path / "run" / FLIGHT_RECORDER).is_dir()  # torch writes the dump there; it does not make folders


def test_the_operators_environment_wins_over_the_nccl_defaults(tmp_path):
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr-"}
    chosen = nccl_environment(env, 1200, str(tmp_path))
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "0" and env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/scratch/fr-"
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in chosen and not (tmp_path / FLIGHT_RECORDER).exists()
