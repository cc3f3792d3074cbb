"""The dashboard's picture for docs/metrics.md, drawn from real data.

A short 2-rank CPU torchrun run on the digits reads its shards from a real nginx, which is stopped for a while
mid-run (so the I/O panel has an outage to show); Debian's prometheus on 127.0.0.1 scrapes both ranks every second.
Each panel of the chart's dashboard (helm/imagenet-train/files/dashboard.json) is then asked of Prometheus' HTTP API
over the run (query_range, the panel's own PromQL) and drawn with matplotlib, by rank, as Grafana would.

    python tools/dashboard_png.py [--seconds 300] [--outage-at 150] [--outage 20] [--out docs/img/dashboard.png]

Needs `prometheus` and `nginx` on PATH (make system-deps); about --seconds plus a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from local_server import NoAnswer, adjacent_ports, serving

from imagenet_train.datasets.convert import ShardOptions, convert
from imagenet_train.datasets.digits import write_digits
from imagenet_train.ops.serve import NginxServer, free_port

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "helm" / "imagenet-train" / "files" / "dashboard.json"
TRAIN = [
    *("--arch", "resnet18", "--image-size", "32", "--val-resize", "32", "--val-crop-size", "32"),
    *("--batch-size", "32", "--workers", "2", "--no-hflip", "--shuffle-buffer", "200"),
    *("--epochs", "1000", "--epoch-batches", "4"),
]
STEP_S = 2  # query_range's resolution


@contextlib.contextmanager
def prometheus(work: Path, metrics_port: int) -> Iterator[str]:
    """Prometheus on 127.0.0.1 scraping both ranks' ports every second; yields its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("dashboard_png: needs Debian's prometheus on PATH (make system-deps)")
    targets = [f"127.0.0.1:{metrics_port}", f"127.0.0.1:{metrics_port + 1}"]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "imagenet-train", "static_configs": [{"targets": targets}]}],
    }
    (work / "prometheus.yml").write_text(json.dumps(config))
    web = free_port()
    command = [binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}"]
    url = f"http://127.0.0.1:{web}"
    with (work / "prometheus.log").open("w") as log:
        try:
            with serving([*command, f"--web.listen-address=127.0.0.1:{web}"], f"{url}/-/ready", 60, log):
                yield url
        except NoAnswer as error:
            raise SystemExit(f"dashboard_png: prometheus not ready: {error}") from None


def train(work: Path, server: NginxServer, metrics_port: int, options: argparse.Namespace) -> tuple[float, float]:
    """The scraped run, with nginx stopped `options.outage` s at `options.outage_at`; its (start, end) Unix times."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command += ["-m", "imagenet_train.cli", "train", *TRAIN, "--shards", f"{server.url}/shards.json"]
    command += ["--run-dir", str(work / "run"), "--metrics-port", str(metrics_port)]
    with (work / "torchrun.log").open("w") as log:
        environment = {**os.environ, "OMP_NUM_THREADS": "1"}
        run = subprocess.Popen(command, stdout=log, stderr=log, env=environment, start_new_session=True)
        began = time.time()
        try:
            time.sleep(options.outage_at)
            print(f"nginx stopped at {time.time() - began:.0f} s for {options.outage:.0f} s", flush=True)
            server.stop()
            time.sleep(options.outage)
            server.start_again(30)
            time.sleep(max(0.0, options.seconds - (time.time() - began)))
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGTERM)  # a clean stop: the run checkpoints and leaves
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.wait(120)
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    return began, time.time()


def query_range(url: str, query: str, start: float, end: float) -> list[dict]:
    """The series of `query` over [start, end], one point every STEP_S."""
    arguments = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(STEP_S)}
    with urllib.request.urlopen(f"{url}/api/v1/query_range?" + urllib.parse.urlencode(arguments), timeout=30) as got:
        body = json.load(got)
    if body.get("status") != "success":
        raise SystemExit(f"dashboard_png: Prometheus refused {query!r}: {body}")
    return body["data"]["result"]


def panel_series(url: str, panel: dict, start: float, end: float) -> list[tuple[str, list[float], list[float]]]:
    """(legend, seconds since the start, values) of every series of the panel's queries."""
    out = []
    for target in panel["targets"]:
        for series in query_range(url, target["expr"], start, end):
            legend = target.get("legendFormat", "")
            for name, value in series["metric"].items():
                legend = legend.replace("{{" + name + "}}", value)
            times = [float(t) - start for t, _ in series["values"]]
            out.append((legend, times, [float(v) for _, v in series["values"]]))
    return out


def draw(panels: list[dict], series: list[list], out: Path, caption: str) -> None:
    """The panels in the dashboard's 2-column grid, one line per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = (len(panels) + 1) // 2
    figure, axes = plt.subplots(rows, 2, figsize=(12, 2.3 * rows), sharex=True, squeeze=False)
    for axis, panel, lines in zip(axes.flat, panels, series, strict=False):
        percent = panel["fieldConfig"]["defaults"].get("unit") == "percentunit"
        for legend, times, values in lines:
            axis.plot(times, [v * 100 for v in values] if percent else values, linewidth=1.2, label=legend)
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        axis.set_title(panel["title"], fontsize=9)
        axis.set_ylabel("%" if percent else {"none": "", "short": ""}.get(unit, unit), fontsize=8)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
        if lines:
            axis.legend(fontsize=6, loc="best")
        else:
            axis.text(0.5, 0.5, "no data", ha="center", va="center", transform=axis.transAxes, fontsize=8)
    for empty in range(len(panels), axes.size):
        axes.flat[empty].set_visible(False)
        above = axes.flat[empty - 2]  # the panel over an empty cell shows the seconds
        above.xaxis.set_tick_params(labelbottom=True)
        above.set_xlabel("seconds since the run started", fontsize=8)
    for axis in axes[-1]:
        axis.set_xlabel("seconds since the run started", fontsize=8)
    figure.suptitle(caption, fontsize=9)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=72)


def main() -> None:
    """Run, scrape, query, draw."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300, help="how long the run is scraped")
    parser.add_argument("--outage-at", type=float, default=150, help="seconds into the run nginx is stopped")
    parser.add_argument("--outage", type=float, default=20, help="seconds nginx stays stopped")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "dashboard.png")
    options = parser.parse_args()
    panels = json.loads(DASHBOARD.read_text())["panels"]
    with tempfile.TemporaryDirectory(prefix="dashboard-png-") as folder:
        work = Path(folder)
        work.chmod(0o755)  # nginx started as root serves as `nobody`, who must read the shards
        write_digits(work / "digits", size=32)
        convert(str(work / "digits"), str(work / "shards"), ShardOptions(maxcount=130), progress=False)
        metrics_port = adjacent_ports()
        with NginxServer(str(work / "shards")) as server, prometheus(work, metrics_port) as url:
            start, end = train(work, server, metrics_port, options)
            series = [panel_series(url, panel, start, end) for panel in panels]
        for panel, lines in zip(panels, series, strict=True):
            print(f"{panel['title']}: {len(lines)} series", flush=True)
        when = datetime.fromtimestamp(start, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        caption = (
            f"imagenet-train dashboard, {when}: 2-rank CPU torchrun on the digits (resnet18, 32 px), "
            f"nginx stopped {options.outage:.0f} s at {options.outage_at:.0f} s; tools/dashboard_png.py"
        )
        draw(panels, series, options.out, caption)
    print(f"wrote {options.out} ({options.out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
