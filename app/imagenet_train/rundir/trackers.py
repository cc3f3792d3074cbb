"""Experiment trackers (--tracker mlflow|wandb): rank 0 sends the resolved config, each epoch's numbers and the final
checkpoint's location to MLflow or W&B through the tracker's own library, and a resumed run continues the same
tracker run (its id is kept in RUN_DIR/tracker.json).

Every call to the tracker is made on a daemon thread, in order: a tracker that is slow or down never holds a step
up. A call that fails stays queued and is tried again at the next epoch; failures are logged at most once a minute.
The end of the run tries once more, for at most FINISH_S seconds, and names what was not sent."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from imagenet_train.choices import Tracker
from imagenet_train.config import RunConfig
from imagenet_train.errors import ImagenetTrainError, clip, one_line
from imagenet_train.io.atomic import atomic_write
from imagenet_train.redact import credentials, redact
from imagenet_train.rundir.tracker_replies import bound_mlflow, check_transport

if TYPE_CHECKING:
    import wandb

log = logging.getLogger(__name__)

TRACKER_FILE = "tracker.json"  # {"tracker": "mlflow", "run_id": "..."} of the run's tracker run
DEFAULT_PROJECT = "imagenet-train"  # MLflow experiment / W&B project when MLFLOW_EXPERIMENT_NAME / WANDB_PROJECT unset
WARN_EVERY_S = 60.0
FINISH_S = 30.0  # the end of the run waits at most this long for the tracker's last calls
MAX_PENDING = 10_000  # calls kept for a tracker that is down (a few per epoch)
RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
# Left to the user when set: MLflow's defaults retry an unreachable server for minutes on each call.
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
LIBRARIES = {Tracker.MLFLOW.value: "mlflow", Tracker.WANDB.value: "wandb"}  # the import name and the pip extra


def check_installed(tracker: str) -> None:
    """Refuse --tracker when its library is not installed, or its credentials would go over plain http (every rank,
    before the process group)."""
    library = LIBRARIES.get(tracker)
    if library and importlib.util.find_spec(library) is None:
        raise ImagenetTrainError(
            f"--tracker {tracker}: the {library} library is not installed; pip install 'imagenet-train[{library}]'"
        )
    check_transport(tracker)


def flat_params(resolved: dict, prefix: str = "") -> dict[str, Any]:
    """config.json's nested sections as one level of 'section.name' -> value (a tracker's params are flat)."""
    flat: dict[str, Any] = {}
    for key, value in resolved.items():
        if isinstance(value, dict):
            flat.update(flat_params(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def param_text(value: Any) -> str:
    """A param's value as MLflow stores it (text): words as they are, the rest as config.json writes it."""
    return value if isinstance(value, str) else json.dumps(value)


def epoch_metrics(record: dict) -> dict[str, float]:
    """The numbers of a metrics.jsonl record (lists, words and flags are left to metrics.jsonl)."""
    return {
        key: float(value)
        for key, value in record.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


def move_credentials(environ: MutableMapping[str, str]) -> None:
    """A user and password in MLFLOW_TRACKING_URI go to MLFLOW_TRACKING_USERNAME and _PASSWORD (the same basic
    auth), leaving the URI plain: MLflow prints the URI on stdout at a run's end ("View run at") and in its
    errors, and so do our warnings. Variables already set win."""
    user, password, plain = credentials(environ.get("MLFLOW_TRACKING_URI", ""))
    if user or password:
        environ.setdefault("MLFLOW_TRACKING_USERNAME", user)
        environ.setdefault("MLFLOW_TRACKING_PASSWORD", password)
        environ["MLFLOW_TRACKING_URI"] = plain


class MlflowBackend:
    """MLflow through its MlflowClient: MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME / _ID and its other variables
    are read by MLflow itself."""

    def __init__(self) -> None:
        for key, value in MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        move_credentials(os.environ)
        bound_mlflow()  # answers bounded, no redirects: before the first request
        import mlflow

        self.mlflow, self.client, self.run_id = mlflow, mlflow.MlflowClient(), ""

    def start(self, run_id: str | None, name: str, params: dict[str, Any]) -> str:
        """Create the run (or reopen `run_id`) and log the params it does not hold yet."""
        from mlflow.entities import Param

        held = self._held_params(run_id) if run_id else None
        if run_id and held is not None:
            self.client.update_run(run_id, status="RUNNING")
        else:
            run_id = self.client.create_run(self._experiment(), run_name=name).info.run_id
            held = {}
        # A resume changes --resume and often --epochs; MLflow refuses to change a logged param, so the first
        # run's values stay and config.json holds the new ones.
        fresh = [Param(key, param_text(value)) for key, value in params.items() if key not in held]
        for start in range(0, len(fresh), 100):  # log_batch takes 100 params a call
            self.client.log_batch(run_id, params=fresh[start : start + 100])
        self.run_id = run_id
        return run_id

    def _held_params(self, run_id: str) -> dict[str, str] | None:
        """The params of the run to resume; None when this server has no such run (another tracking URI)."""
        try:
            return self.client.get_run(run_id).data.params
        except self.mlflow.exceptions.MlflowException as error:
            if error.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
        log.warning("tracker mlflow: no run %s on %s; starting a new one", run_id, self.mlflow.get_tracking_uri())
        return None

    def _experiment(self) -> str:
        if os.environ.get("MLFLOW_EXPERIMENT_ID"):
            return os.environ["MLFLOW_EXPERIMENT_ID"]
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        found = self.client.get_experiment_by_name(name)
        return found.experiment_id if found else self.client.create_experiment(name)

    def log(self, metrics: dict[str, float], epoch: int) -> None:
        """One epoch's numbers at step = epoch."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, now, epoch) for key, value in metrics.items()])

    def note(self, tags: dict[str, str]) -> None:
        """Tags (the final checkpoint's location)."""
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(key, value) for key, value in tags.items()])

    def finish(self) -> None:
        """Mark the run finished."""
        self.client.set_terminated(self.run_id, "FINISHED")


class WandbBackend:
    """W&B through wandb.init: WANDB_PROJECT, WANDB_ENTITY, WANDB_MODE, WANDB_DIR, WANDB_API_KEY and its other
    variables are read by wandb itself; without WANDB_DIR its files go under the run directory."""

    run: wandb.Run  # from start(), which the sink calls before anything else

    def __init__(self, run_dir: Path) -> None:
        import wandb

        self.wandb, self.run_dir = wandb, run_dir

    def start(self, run_id: str | None, name: str, params: dict[str, Any]) -> str:
        """wandb.init a new run (or resume `run_id`), with the params as its config."""
        settings = self.wandb.Settings(console="off", silent=True, x_disable_stats=True, init_timeout=60)
        self.run = self.wandb.init(
            project=None if os.environ.get("WANDB_PROJECT") else DEFAULT_PROJECT,
            dir=None if os.environ.get("WANDB_DIR") else str(self.run_dir),
            id=run_id,
            resume="allow" if run_id else None,
            name=name,
            settings=settings,
        )
        self.run.config.update(params, allow_val_change=True)  # a resume's --epochs and --resume replace the first's
        self.run.define_metric("epoch")
        self.run.define_metric("*", step_metric="epoch")  # an epoch trained again after a resume is not refused
        return self.run.id

    def log(self, metrics: dict[str, float], epoch: int) -> None:
        """One epoch's numbers, against the epoch."""
        self.run.log({**metrics, "epoch": epoch})

    def note(self, tags: dict[str, str]) -> None:
        """Summary fields (the final checkpoint's location)."""
        self.run.summary.update(tags)

    def finish(self) -> None:
        """Finish the run (offline: its files are complete)."""
        self.run.finish()


class TrackerSink:
    """Rank 0's tracker run: each call queued and made in order on a daemon thread (see the module docstring)."""

    def __init__(self, tracker: str, run_dir: Path, resume: bool, results: str = ""):
        self.tracker, self.run_dir, self.resume, self.results = tracker, Path(run_dir), resume, results
        self.calls: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.pending: deque[Callable[[], None]] = deque()
        self.backend: Any = None
        self.run_id = ""
        self.failures, self.warned_at = 0, -math.inf
        self.done = threading.Event()
        threading.Thread(target=self._serve, name=f"tracker-{tracker}", daemon=True).start()

    # -- what the run sends ---------------------------------------------------------------------
    def begin(self, resolved: dict) -> None:
        """Start (or, resuming, reopen) the tracker run with config.json's settings as params."""
        run_id = saved_run_id(self.run_dir, self.tracker, self.resume)
        name, params = self.run_dir.resolve().name, flat_params(resolved)
        self.calls.put(lambda: self._start(run_id, name, params))

    def epoch(self, record: dict) -> None:
        """Send an epoch's numbers (step = its epoch)."""
        metrics, epoch = epoch_metrics(record), record["epoch"]
        self.calls.put(lambda: self.backend.log(metrics, epoch))

    def close(self, timeout: float = FINISH_S) -> None:
        """The end of the run: the final checkpoint's location, then finish; waits at most `timeout` s."""
        final = self.run_dir / "final.pt"
        if final.is_file():
            tags = {"final_checkpoint": str(final.resolve())}
            if self.results:
                tags["final_checkpoint_mirror"] = redact(f"{self.results.rstrip('/')}/final.pt")
            self.calls.put(lambda: self.backend.note(tags))
        self.calls.put(lambda: self.backend.finish())
        self.calls.put(None)
        if not self.done.wait(timeout) or self.pending:
            left = len(self.pending) + sum(call is not None for call in list(self.calls.queue))
            log.warning(
                "tracker %s: %d calls not sent by the end of the run (metrics.jsonl and config.json hold it all)",
                self.tracker,
                left,
            )

    # -- the thread -----------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            calls = [self.calls.get()]
            while not self.calls.empty():  # all that came meanwhile, then one try: no back-to-back retries
                calls.append(self.calls.get())
            for call in calls:
                if call is not None:
                    self.pending.append(call)
                if len(self.pending) > MAX_PENDING:
                    del self.pending[1]  # the oldest after the one being tried (the start, until it worked)
            self._flush()
            if None in calls:
                self.done.set()
                return

    def _flush(self) -> None:
        while self.pending:
            try:
                self.pending[0]()
            except Exception as error:  # the tracker's library raises its own kinds; none may stop training
                self._warn(error)
                return
            self.pending.popleft()

    def _warn(self, error: BaseException) -> None:
        self.failures += 1
        now = time.monotonic()
        if now - self.warned_at >= WARN_EVERY_S:
            self.warned_at = now
            log.warning(
                "tracker %s: %s (%d failed calls so far, %d waiting; training goes on, tried again next epoch)",
                self.tracker,
                clip(one_line(f"{type(error).__name__}: {error}"), 300),
                self.failures,
                len(self.pending),
            )

    def _start(self, run_id: str | None, name: str, params: dict[str, Any]) -> None:
        if self.backend is None:
            self.backend = MlflowBackend() if self.tracker == Tracker.MLFLOW.value else WandbBackend(self.run_dir)
        self.run_id = self.backend.start(run_id, name, params)
        with atomic_write(self.run_dir / TRACKER_FILE, private=True) as stream:
            stream.write(json.dumps({"tracker": self.tracker, "run_id": self.run_id}).encode() + b"\n")
        shown = clip(self.run_id, 128)  # the tracker server's answer
        print(f"tracker {self.tracker}: run {shown}{' resumed' if run_id == self.run_id else ''}", flush=True)


def saved_run_id(run_dir: Path, tracker: str, resume: bool) -> str | None:
    """The tracker run to continue: RUN_DIR/tracker.json's, when resuming with the same tracker (a file that is
    not ours is a warning and a new tracker run: the tracker never stops training)."""
    path = Path(run_dir) / TRACKER_FILE
    if not resume or not path.is_file():
        return None
    try:
        with open(path, "rb") as stream:
            saved = json.loads(stream.read(4096))
        run_id = saved["run_id"] if saved["tracker"] == tracker else None
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        run_id = ""
    if run_id is None or (isinstance(run_id, str) and RUN_ID.fullmatch(run_id)):
        return run_id
    log.warning("%s: not a tracker record of ours (expected a run id); starting a new tracker run", path)
    return None


def open_tracker(run: RunConfig) -> TrackerSink | None:
    """Rank 0's tracker for this run's --tracker (None for none)."""
    if run.tracker == Tracker.NONE.value:
        return None
    return TrackerSink(run.tracker, Path(run.run_dir), bool(run.resume), run.results)
