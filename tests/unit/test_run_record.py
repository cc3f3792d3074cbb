"""metrics.jsonl as the run record keeps it: whole lines in epoch order, an epoch's line before its checkpoint,
the epochs a resume trains again dropped, a fetched copy merged rather than replacing this node's, and
checkpoints uploaded after the lines that describe them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.rundir.results_mirror import upload_order
from imagenet_train.rundir.run_record import EpochRecords, epoch_lines, merge_fetched

pytestmark = pytest.mark.unit


def record(epoch: int, top1: float) -> dict:
    """An epoch's record with the fields the summary line reads."""
    fields = {"train_loss": 1.0, "samples_per_s": 1.0, "epoch_time_s": 1.0, "corrupt_samples": 0}
    return {"epoch": epoch, "top1": top1, **fields, "broken_shards": 0, "lost_samples": 0}


def epochs(run_dir: Path) -> list[tuple[int, float]]:
    """(epoch, top1) of each line of the run's metrics.jsonl, in file order."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(json.loads(line)["epoch"], json.loads(line)["top1"]) for line in lines]


def test_each_epoch_has_one_line_in_epoch_order_and_a_repeat_replaces_it(tmp_path):
    records = EpochRecords(tmp_path, tensorboard=False)
    for epoch, top1 in ((0, 0.1), (1, 0.2), (1, 0.25), (2, 0.3)):
        records.write(record(epoch, top1), global_step=epoch)
    assert epochs(tmp_path) == [(0, 0.1), (1, 0.25), (2, 0.3)]
    assert not [p.name for p in tmp_path.iterdir() if p.name != "metrics.jsonl"]  # no temporary file left


def test_a_resume_drops_the_lines_of_the_epochs_it_trains_again(tmp_path):
    records = EpochRecords(tmp_path, tensorboard=False)
    for epoch in range(4):
        records.write(record(epoch, epoch / 10), global_step=epoch)
    records.keep_before(2)  # the newest checkpoint was epoch 1's: epochs 2 and 3 are trained again
    assert epochs(tmp_path) == [(0, 0.0), (1, 0.1)]
    records.write(record(2, 0.5), global_step=2)
    assert epochs(tmp_path) == [(0, 0.0), (1, 0.1), (2, 0.5)]


def test_a_fetched_copy_is_merged_with_this_nodes_epoch_by_epoch(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 0, "top1": 0.1}\n{"epoch": 3, "top1": 0.4}\n')  # the bucket's, just fetched
    merge_fetched(path, {1: b'{"epoch": 1, "top1": 0.2}\n', 0: b'{"epoch": 0, "top1": 0.1}\n'})
    assert epochs(tmp_path) == [(0, 0.1), (1, 0.2), (3, 0.4)]


@pytest.mark.parametrize("line", ['{"top1": 1}', "[1, 2]", '{"epoch": "one"}', '{"epoch": -1}', "{not json"])
def test_a_line_without_a_whole_number_epoch_is_one_line_naming_file_and_line(tmp_path, line):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 0}\n' + line + "\n")
    with pytest.raises(ImagenetTrainError, match=rf"^{path} line 2: expected a JSON object with a whole-number"):
        epoch_lines(path)


def test_checkpoints_are_uploaded_after_every_other_file():
    names = ["checkpoints/epoch-0001.pt", "metrics.jsonl", "final.pt", "config.json", "keys/rank0.log"]
    ordered = [str(p) for p in sorted(map(Path, names), key=upload_order)]
    assert ordered == ["config.json", "keys/rank0.log", "metrics.jsonl", "checkpoints/epoch-0001.pt", "final.pt"]
