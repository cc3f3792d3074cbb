"""Ranks resuming from their own run directories (one per node, filled from --results) agree on the checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# Each rank of a two-rank gloo world looks in its own run directory, as two nodes do.
WORLD = textwrap.dedent(
    """
    import datetime, json, logging, sys
    import torch.distributed as dist
    from imagenet_train.rundir.checkpoint import latest_on_every_rank
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    rank, store, run_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group(
        "gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60)
    )
    path = latest_on_every_rank(run_dir, rank, 2)
    print(json.dumps(path.name if path else None))
    dist.destroy_process_group()
    """
)


@pytest.mark.parametrize(
    ("held", "agreed"),
    [
        # Node 1 restarted while rank 0's epoch-0001.pt was still uploading.
        ((["epoch-0000.pt", "epoch-0001-step-000004.pt", "epoch-0001.pt"], ["epoch-0000.pt"]), "epoch-0000.pt"),
        ((["epoch-0000.pt", "epoch-0001.pt"], ["epoch-0000.pt", "epoch-0001.pt"]), "epoch-0001.pt"),
        ((["epoch-0000.pt"], []), None),
    ],
)
def test_ranks_resume_from_the_newest_checkpoint_every_rank_holds(tmp_path, held, agreed):
    commands = []
    for rank, names in enumerate(held):
        folder = tmp_path / f"node{rank}" / "checkpoints"
        folder.mkdir(parents=True)
        for name in names:
            (folder / name).write_bytes(b"")
        commands.append([sys.executable, "-c", WORLD, str(rank), str(tmp_path / "store"), str(folder.parent)])
    ranks = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for command in commands
    ]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    assert [json.loads(out) for out, _ in outputs] == [agreed, agreed]
    newer = held[0] != held[1]
    assert ("not every rank does" in outputs[0][1]) == newer, outputs[0][1]
