"""`imagenet-train ray`: train on a Ray cluster with Ray Train, each Ray worker running our trainer as one rank.

Ray starts N workers (one per GPU the cluster has, unless told) and sets up their process group;
`train(runnable(cfg))` then runs unchanged in it. A worker that dies makes Ray restart the whole group
(FailureConfig), and every restart continues from the run directory's newest checkpoint, exactly as
`--resume latest` does under torchrun.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from pathlib import Path

from imagenet_train.config import SECTIONS, Config
from imagenet_train.errors import ImagenetTrainError, one_line


@dataclasses.dataclass(frozen=True)
class RayTrainOptions:
    """How Ray Train runs the workers (`imagenet-train ray`'s options, as commands/launch_cmd.py reads them)."""

    address: str = ""  # "" : the cluster in RAY_ADDRESS, else a new local one
    workers: int = 0  # 0: one per GPU of the cluster
    gpus: bool | None = None  # None: use GPUs when the cluster has any
    max_failures: int = 3  # worker-group restarts before the run fails
    cpus_per_worker: float = 1.0


def world_size(options: RayTrainOptions, cluster_gpus: int) -> tuple[int, bool]:
    """Workers and whether they use GPUs: one per GPU Ray detected unless --workers says otherwise."""
    use_gpu = cluster_gpus > 0 if options.gpus is None else options.gpus
    if use_gpu and cluster_gpus == 0:
        raise ImagenetTrainError("ray --gpus: the Ray cluster reports no GPUs (use --no-gpus for CPU workers)")
    workers = options.workers or (cluster_gpus if use_gpu else 0)
    if workers < 1:
        raise ImagenetTrainError("ray: the Ray cluster has no GPUs; give --workers N to train on N CPU workers")
    return workers, use_gpu


def run(cfg: Config, options: RayTrainOptions) -> dict:
    """Train `cfg` on the Ray cluster; returns the last epoch's metrics."""
    from imagenet_train.datasets.source import run_source
    from imagenet_train.main.entry_checks import runnable
    from imagenet_train.planning.plan import preflight_check

    cfg.run.run_dir = str(Path(cfg.run.run_dir).resolve())  # the workers' folder, whatever their working directory
    cfg = runnable(cfg)
    # Bad shards or a hanging layout fail here, once, instead of in every worker on every restart.
    source = run_source(cfg.data, cfg.loader.io_timeout)
    try:
        import ray
        from ray.train import FailureConfig, ScalingConfig
        from ray.train import RunConfig as RayRunConfig
        from ray.train.torch import TorchConfig, TorchTrainer
    except ImportError:
        raise ImagenetTrainError("ray: needs Ray Train (pip install 'imagenet-train[ray]')") from None
    from imagenet_train.launchers.telemetry import telemetry_defaults

    # Before ray.init: a local cluster's processes start from this environment. One started elsewhere
    # (`ray start`, RAY_ADDRESS) decides at its own start; the image's ENV carries the same switches.
    os.environ.update(telemetry_defaults(os.environ))
    ray.init(address=options.address or None, logging_level=logging.WARNING, include_dashboard=False)
    try:
        workers, use_gpu = world_size(options, int(ray.cluster_resources().get("GPU", 0)))
        assessment = preflight_check(cfg, source.train_sizes, workers)
        verdict = assessment.verdict if assessment else "not checked (the index gives no shard sizes)"
        print(f"ray: {workers} {'GPU' if use_gpu else 'CPU'} workers; plan: {verdict}", flush=True)
        run_dir = Path(cfg.run.run_dir)
        trainer = TorchTrainer(
            train_worker,
            train_loop_config={"config": dataclasses.asdict(cfg), "run_id": uuid.uuid4().hex},
            torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo", timeout_s=1800),
            scaling_config=ScalingConfig(
                num_workers=workers, use_gpu=use_gpu, resources_per_worker={"CPU": options.cpus_per_worker}
            ),
            run_config=RayRunConfig(
                name=run_dir.name,
                storage_path=str(run_dir / "ray"),
                failure_config=FailureConfig(max_failures=options.max_failures),
            ),
        )
        try:
            trainer.fit()
        except ray.train.TrainingFailedError as error:
            raise ImagenetTrainError(
                f"ray: training failed after {options.max_failures} restarts: "
                f"{one_line(str(error).strip().splitlines()[-1])}"
            ) from None
    finally:
        ray.shutdown()
    from imagenet_train.ops.run_report import read_records

    return read_records(run_dir)[-1]


def train_worker(loop_config: dict) -> None:
    """One Ray worker: our trainer as one rank of the group Ray set up; a restart resumes from the latest checkpoint."""
    import ray.train
    import torch

    from imagenet_train.main.entry_checks import runnable
    from imagenet_train.main.train import train

    local_rank = ray.train.get_context().get_local_rank()
    os.environ["LOCAL_RANK"] = str(local_rank)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    cfg = config_from_dict(loop_config["config"])
    if restarted(Path(cfg.run.run_dir) / "ray" / f"started-{loop_config['run_id']}"):
        cfg.run.resume = "latest"
    train(runnable(cfg))  # checked again on the worker's node: the libraries it needs must be installed there too


def restarted(marker: Path) -> bool:
    """Whether this run's workers started before (rank 0 decides, every rank agrees)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flag = torch.zeros(1, dtype=torch.int64, device=device)
    if dist.get_rank() == 0:
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:
            marker.open("x").close()
        except FileExistsError:
            flag[0] = 1
    dist.broadcast(flag, src=0)
    return bool(flag[0])


def config_from_dict(document: dict) -> Config:
    """A Config from its `dataclasses.asdict` form."""
    fields = dataclasses.fields(Config)
    return Config(**{f.name: section(**document[f.name]) for f, section in zip(fields, SECTIONS, strict=True)})
