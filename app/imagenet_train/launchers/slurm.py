"""Slurm: the sbatch script `imagenet-train slurm` writes, and the `SLURM_*` mapping `imagenet-train launch` uses.

One task per node (`srun --ntasks-per-node=1`) runs `imagenet-train launch`, which starts torchrun with one
process per GPU; node 0 of the step is the rendezvous host.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from imagenet_train.errors import RETRY_EXIT, ImagenetTrainError
from imagenet_train.launchers.remote_words import refuse_control

# A rendezvous port derived from the job id, so two jobs sharing a node do not collide; below Linux's
# ephemeral range (32768-60999) so no outgoing connection holds it.
PORT_BASE = 20000
PORT_SPAN = 10000
# 128 + SIGUSR1, 128 + SIGTERM: training stopped cleanly after a checkpoint; 138 (errors.RETRY_EXIT) also when a
# rank found another gone. Either way the job is requeued and resumes from the last checkpoint.
PRE_EMPTION_EXIT = (RETRY_EXIT, 128 + signal.SIGTERM)


def expand_nodelist(nodelist: str) -> list[str]:
    """Host names of a Slurm compressed node list, e.g. 'node[01-03,07],gpu5' -> node01 node02 node03 node07 gpu5."""
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        hosts.extend(_expand_item(item, nodelist))
    if not hosts:
        raise ImagenetTrainError(f"launch: SLURM node list '{nodelist}' names no host")
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item]


def _expand_item(item: str, nodelist: str) -> list[str]:
    match = re.search(r"\[([^\[\]]*)\]", item)
    if not match:
        if "[" in item or "]" in item:
            raise ImagenetTrainError(f"launch: SLURM node list '{nodelist}': unbalanced brackets in '{item}'")
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    names = []
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ImagenetTrainError(f"launch: SLURM node list '{nodelist}': bad range '{part}'")
        width = len(low)  # node[01-03] keeps its zero padding
        for number in range(int(low), int(high or low) + 1):
            names.extend(_expand_item(f"{head}{number:0{width}d}{tail}", nodelist))
    return names


def _gpus(value: str) -> str:
    """'4', 'gpu:4' or 'a100:4' (SLURM_GPUS_PER_NODE) -> '4'."""
    number = value.rsplit(":", 1)[-1].split("(", 1)[0]
    return number if number.isdigit() else ""


def node_address(name: str) -> str:
    """The address of a node: its name when that resolves, else its NodeAddr from `scontrol show node`."""
    try:
        socket.getaddrinfo(name, None)
        return name
    except OSError:
        pass
    if shutil.which("scontrol"):
        shown = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True, text=True, timeout=30)
        found = re.search(r"\bNodeAddr=(\S+)", shown.stdout)
        if found:
            return found.group(1)
    return name


def torchrun_args(env: Mapping[str, str], nproc: str | None, local_devices: Callable[[], str]) -> list[str]:
    """torchrun's static rendezvous options for one Slurm task per node (node 0 of the step hosts it)."""
    in_step = "SLURM_STEP_ID" in env  # absent in the batch script itself, present under srun
    nnodes = (env.get("SLURM_STEP_NUM_NODES") if in_step else "") or env.get("SLURM_NNODES") or ""
    nnodes = nnodes or env.get("SLURM_JOB_NUM_NODES", "1")
    if not nnodes.isdigit():
        raise ImagenetTrainError(f"launch: SLURM_NNODES='{nnodes}' is not a whole number")
    if not in_step and nnodes != "1":
        raise ImagenetTrainError(
            f"launch: the batch script of a {nnodes}-node Slurm job; start one launch per node with "
            "`srun --ntasks-per-node=1 imagenet-train launch ...`"
        )
    if env.get("SLURM_LOCALID", "0") != "0":
        raise ImagenetTrainError(
            f"launch: Slurm started task {env['SLURM_LOCALID']} on this node; one `imagenet-train launch` per node "
            "starts every process (srun --ntasks-per-node=1)"
        )
    node_rank = env.get("SLURM_NODEID") or env.get("SLURM_PROCID") or "0"
    nodelist = (env.get("SLURM_STEP_NODELIST") if in_step else "") or env.get("SLURM_JOB_NODELIST", "")
    nodelist = nodelist or env.get("SLURM_NODELIST", "")
    if env.get("MASTER_ADDR"):
        addr = env["MASTER_ADDR"]
    elif nnodes == "1":
        addr = "localhost"
    elif nodelist:
        addr = node_address(expand_nodelist(nodelist)[0])
    else:
        raise ImagenetTrainError("launch: Slurm environment without SLURM_JOB_NODELIST")
    job = env.get("SLURM_JOB_ID", "0")
    port = env.get("MASTER_PORT") or str(PORT_BASE + int(job) % PORT_SPAN if job.isdigit() else 29500)
    per_node = nproc or _gpus(env.get("SLURM_GPUS_ON_NODE", "")) or _gpus(env.get("SLURM_GPUS_PER_NODE", ""))
    return [
        f"--nnodes={nnodes}",
        f"--node_rank={node_rank}",
        f"--nproc_per_node={per_node or local_devices()}",
        f"--master_addr={addr}",
        f"--master_port={port}",
    ]


@dataclass
class BatchJob:
    """What `imagenet-train slurm` puts in the sbatch script."""

    program: list[str]  # the imagenet-train command run on every node, e.g. ['train', '--shards', ...]
    nodes: int = 1
    gpus_per_node: int = 0  # 0: a CPU job (one process per node)
    cpus_per_task: int = 0
    partition: str = ""
    time: str = ""
    signal: str = "USR1@120"  # '' for none
    output: str = "imagenet-train-%j.out"
    job_name: str = "imagenet-train"
    requeue: bool = False
    executable: str = "imagenet-train"
    extra: list[str] = field(default_factory=list)  # further #SBATCH options, e.g. --account=X


def _check(job: BatchJob) -> None:
    """Every value written into the script is one line: a newline would start a shell line of its own."""
    for flag, value in (
        ("--job-name", job.job_name),
        ("--partition", job.partition),
        ("--time", job.time),
        ("--signal", job.signal),
        ("--output", job.output),
        ("--executable", job.executable),
    ):
        refuse_control(value, flag)
    for option in job.extra:
        refuse_control(option, "--sbatch-option")
    for word in job.program:
        refuse_control(word, "the command after '--'")


def batch_script(job: BatchJob) -> str:
    """The sbatch script: #SBATCH options, then one `imagenet-train launch` per node under srun."""
    _check(job)
    options = [
        f"--job-name={job.job_name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--output={job.output}",
    ]
    options += [f"--gpus-per-node={job.gpus_per_node}"] if job.gpus_per_node else []
    options += [f"--cpus-per-task={job.cpus_per_task}"] if job.cpus_per_task else []
    options += [f"--partition={job.partition}"] if job.partition else []
    options += [f"--time={job.time}"] if job.time else []
    # No 'B:' prefix: the signal goes to every srun task (each node's launch), which stops training cleanly.
    options += [f"--signal={job.signal}"] if job.signal else []
    options += ["--requeue", "--open-mode=append"] if job.requeue else []
    options += job.extra
    program = list(job.program)
    if job.requeue and "--resume" not in program:
        program += ["--resume", "latest"]  # a requeued job continues from its last checkpoint
    nproc = ["--nproc-per-node", str(job.gpus_per_node or 1)]
    launch = [*shlex.split(job.executable), "launch", *nproc, "--", *program]
    lines = ["#!/bin/bash", *(f"#SBATCH {option}" for option in options), ""]
    lines += [
        "# Written by `imagenet-train slurm`: one task per node runs `imagenet-train launch`, which maps",
        "# SLURM_* (nodes, node rank, first node, GPUs) to torchrun. Training stops cleanly on SIGUSR1/SIGTERM.",
        "set -uo pipefail",
        # No --kill-on-bad-exit: after a pre-emption the node that stops first would cut off rank 0's checkpoint.
        # --unbuffered: progress bars reach the output file as they update; srun otherwise holds back a line until
        # its newline, so an epoch's bar would show only once the epoch ended.
        "srun --unbuffered --ntasks-per-node=1 " + shlex.join(launch),
        "status=$?",
    ]
    if job.requeue:
        codes = " || ".join(f"[ $status -eq {code} ]" for code in PRE_EMPTION_EXIT)
        lines += [
            f"if {codes}; then",
            '  echo "imagenet-train: stopped to resume from the last checkpoint (exit $status: a pre-emption signal'
            ' or a lost node); requeueing job $SLURM_JOB_ID"',
            '  scontrol requeue "$SLURM_JOB_ID"',
            "fi",
        ]
    lines += ["exit $status", ""]
    return "\n".join(lines)


def write_script(job: BatchJob, path: str) -> Path:
    """Write the sbatch script (executable) and return its path."""
    text = batch_script(job)  # checked before anything is written
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(0o755)
    return target


def submit(script: Path, sbatch_args: Sequence[str] = ()) -> str:
    """Submit the script with sbatch and return the job id."""
    if not shutil.which("sbatch"):
        raise ImagenetTrainError("slurm --submit: sbatch not found on PATH (run on a Slurm login node)")
    result = subprocess.run(
        ["sbatch", "--parsable", *sbatch_args, str(script)], capture_output=True, text=True, env=os.environ
    )
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        raise ImagenetTrainError(f"slurm --submit: sbatch refused {script}: {reason}")
    return result.stdout.strip().split(";", 1)[0]
