"""NGC batch submission from the chart's values: `ngc batch run` for single and multinode jobs,
log following and killing this project's jobs. Pure command building apart from `NGCClient`.

Inside the job the image's `imagenet-train launch` maps NGC_ARRAY_SIZE / NGC_ARRAY_INDEX /
NGC_GPUS_PER_NODE / NGC_MASTER_ADDR to torchrun, exactly as it maps a PyTorchJob's environment.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from imagenet_train.deployment import ShardServer, gpus_per_node, nproc, owned_flags, settings_flags
from imagenet_train.errors import ImagenetTrainError

INSTALL_HINT = (
    "the NGC CLI (`ngc`) is not installed: download it from https://org.ngc.nvidia.com/setup/installers/cli, "
    "put it on PATH and run `ngc config set`"
)
ACTIVE = ("QUEUED", "STARTING", "RUNNING")


def shards_source(values: dict) -> tuple[str, list[str]]:
    """Where the job reads the index, and the environment (KEY:VALUE) that needs."""
    ngc, shards = values["ngc"], values["shards"]
    if ngc["shards"]:
        return ngc["shards"], []
    if shards["server"] == ShardServer.BUCKET:
        return f"{shards['bucket']['url'].rstrip('/')}/{shards['index']}", []
    if shards["server"] == ShardServer.AISTORE:
        endpoint = shards["aistore"]["endpoint"].rstrip("/")
        if not endpoint:
            raise ImagenetTrainError(
                "shards.aistore.endpoint: NGC jobs need an existing AIStore endpoint (deploy is for Kubernetes)"
            )
        return f"ais://{shards['aistore']['bucket']}/{shards['index']}", [f"AIS_ENDPOINT:{endpoint}"]
    raise ImagenetTrainError(
        "shards.server: nginx runs inside Kubernetes; on NGC set ngc.shards to the index in a mounted dataset "
        "(ngc.datasets) or use shards.server bucket or aistore"
    )


def instance_gpus(instance: str) -> int:
    """GPUs of an NGC instance name such as dgxa100.80g.8.norm."""
    match = re.fullmatch(r"[a-z0-9]+\.[a-z0-9]+\.(\d+)\.[a-z0-9]+", instance)
    if not match:
        raise ImagenetTrainError(f"ngc.instance: '{instance}' is not an NGC instance name like dgxa100.80g.8.norm")
    return int(match.group(1))


def _placement_flags(ngc: dict, env: list[str]) -> list[str]:
    """The job's ace/org/team, workspaces, datasets, environment variables and labels as `ngc batch run` flags."""
    argv = [arg for flag in ("ace", "org", "team") if ngc[flag] for arg in (f"--{flag}", ngc[flag])]
    for workspace in ngc["workspaces"]:
        argv += ["--workspace", f"{workspace['id']}:{workspace['mount']}:{workspace.get('mode', 'RO')}"]
    for dataset in ngc["datasets"]:
        argv += ["--datasetid", f"{dataset['id']}:{dataset['mount']}"]
    for variable in env:
        argv += ["--env-var", variable]
    for label in [ngc["projectLabel"], *ngc["labels"]]:
        argv += ["--label", label]
    return argv


def run_command(values: dict, name: str, default_tag: str = "latest") -> list[str]:
    """The full `ngc batch run` argv for these values (validated by the chart's schema beforehand)."""
    ngc, launcher = values["ngc"], values["launcher"]
    gpus = instance_gpus(ngc["instance"])
    if gpus != gpus_per_node(values):
        raise ImagenetTrainError(
            f"ngc.instance: {ngc['instance']} has {gpus} GPUs per node but resources.limits asks for "
            f"nvidia.com/gpu: {gpus_per_node(values)}"
        )
    if launcher["elastic"]["enabled"]:
        raise ImagenetTrainError("launcher.elastic.enabled: NGC arrays are static; disable elastic for NGC jobs")
    if values["image"]["digest"]:  # refused, not dropped: the run would not be the image the values pin
        raise ImagenetTrainError(
            "image.digest: NGC batch jobs name their image by tag (--image REPOSITORY:TAG), so a digest cannot pin "
            'them; for NGC, add a values file with image.digest "" and image.tag the tag you pushed'
        )
    shards_url, env = shards_source(values)
    if ngc["gcpKeyFile"]:
        env.append(f"GOOGLE_APPLICATION_CREDENTIALS:{ngc['gcpKeyFile']}")
    results = values["results"]["bucket"]
    run_name = values["results"]["runName"] or name
    program = ["launch", "--nproc-per-node", str(nproc(values))]
    if shards_url.startswith("ais://"):
        program += ["--wait-for", shards_url, "--wait-timeout", str(launcher["waitForShardsSeconds"])]
    # NGC mounts no config file: the chart's `train:` settings travel as flags.
    program += ["--", "train", *settings_flags(values["train"] or {})]
    program += owned_flags(shards_url, ngc["resultDir"], results=f"{results.rstrip('/')}/{run_name}" if results else "")
    # Called by name, so the job runs the same whether NGC keeps the image's entrypoint or replaces it.
    commandline = shlex.join(["imagenet-train", *program])
    image = f"{values['image']['repository']}:{values['image']['tag'] or default_tag}"
    argv = ["ngc", "batch", "run", "--name", name, "--image", image, "--instance", ngc["instance"]]
    argv += ["--commandline", commandline, "--result", ngc["resultDir"], "--total-runtime", ngc["totalRuntime"]]
    argv += ["--preempt", ngc["preempt"]]
    argv += _placement_flags(ngc, env)
    if launcher["nodes"] > 1:
        argv += ["--array-type", "PYTORCH", "--replicas", str(launcher["nodes"])]
    return argv + ["--format_type", "json"]


def default_state_file() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(os.environ.get("IMAGENET_TRAIN_NGC_STATE") or os.path.join(base, "imagenet-train", "ngc-jobs.json"))


@dataclass
class JobState:
    """The jobs this machine submitted, newest last: {id, name, label, submitted}."""

    path: Path

    def jobs(self) -> list[dict]:
        if not self.path.exists():
            return []
        try:
            return list(json.loads(self.path.read_text()))
        except (json.JSONDecodeError, TypeError):
            raise ImagenetTrainError(f"{self.path}: not a job state file (delete it to start over)") from None

    def add(self, job: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps([*self.jobs(), job], indent=1) + "\n")
        os.replace(temporary, self.path)

    def last(self) -> dict:
        jobs = self.jobs()
        if not jobs:
            raise ImagenetTrainError(f"{self.path}: no submitted job recorded yet (run `tools/ngc.py submit` first)")
        return jobs[-1]


class NGCClient:
    """Runs the `ngc` CLI; everything else in this module only builds argv."""

    def __init__(self, executable: str = "ngc"):
        found = shutil.which(executable)
        if not found:
            raise ImagenetTrainError(INSTALL_HINT)
        self.executable = found

    def run(self, argv: list[str], capture: bool = True) -> str:
        result = subprocess.run([self.executable, *argv[1:]], capture_output=capture, text=True)
        if result.returncode != 0:
            detail = (result.stderr or result.stdout or "").strip().splitlines()
            raise ImagenetTrainError(f"{' '.join(argv[:3])}: failed ({detail[-1] if detail else result.returncode})")
        return result.stdout or ""


def submit(client: NGCClient, state: JobState, argv: list[str]) -> dict:
    """Run `ngc batch run`, record the job id from its JSON answer."""
    out = client.run(argv)
    try:
        answer = json.loads(out)
        job_id = str(answer.get("id") or answer["jobId"]) if isinstance(answer, dict) else None
    except (json.JSONDecodeError, KeyError):
        job_id = None
    if not job_id:
        raise ImagenetTrainError(f"ngc batch run: no job id in its answer: {out.strip()[:200]!r}")
    name = argv[argv.index("--name") + 1]
    label = argv[argv.index("--label") + 1]
    job = {"id": job_id, "name": name, "label": label, "submitted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    state.add(job)
    return job


def tail_command(job_id: str, result_dir: str = "/results") -> list[str]:
    """Follow a running job's log: NGC writes the job's output to joblog.log in its result mount."""
    log = shlex.quote(f"{result_dir}/joblog.log")  # the job's shell reads this line
    return ["ngc", "batch", "exec", "--commandline", f"tail -n +1 -f {log}", job_id]


def list_command() -> list[str]:
    argv = ["ngc", "batch", "list", "--format_type", "json"]
    for status in ACTIVE:
        argv += ["--status", status]
    return argv


def _labels(job: dict) -> set[str]:
    found: set[str] = set()
    for key in ("labels", "jobLabels", "userLabels", "systemLabels"):
        for where in (job, job.get("jobDefinition") or {}):
            value = where.get(key)
            if isinstance(value, list):
                found.update(str(v) for v in value)
    return found


def project_jobs(listing: list[dict], label: str, known_ids: set[str]) -> list[dict]:
    """Active jobs of this project: carrying its label, or submitted from here."""
    chosen = []
    for job in listing:
        job_id = str(job.get("id", ""))
        if job_id and (label in _labels(job) or job_id in known_ids):
            chosen.append(job)
    return chosen


def kill_command(job_ids: list[str]) -> list[str]:
    return ["ngc", "batch", "kill", *job_ids]
