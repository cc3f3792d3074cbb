"""`imagenet-train probe`: what the chart's init container and `helm test` hook run against the shard server."""

from __future__ import annotations

import json
import shutil
import threading
import time

from imagenet_train.ops.serve import NginxServer

from conftest import cli


def test_probe_reads_the_index_and_one_whole_shard_from_nginx(shard_server):
    result = cli("probe", f"{shard_server.url}/shards.json")
    assert result.returncode == 0, result.stderr
    assert "1438 train samples in 12 shards" in result.stdout
    assert "130 samples" in result.stdout


def test_probe_reports_a_shard_whose_count_disagrees_with_the_index(digit_shards, tmp_path):
    copy = tmp_path / "shards"
    shutil.copytree(digit_shards, copy)
    index = json.loads((copy / "shards.json").read_text())
    index["splits"]["train"]["shardlist"][0]["nsamples"] = 131
    (copy / "shards.json").write_text(json.dumps(index))
    result = cli("probe", str(copy))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "130 samples, the index says 131" in result.stderr


def test_probe_of_a_deployment_file_alone_reads_its_shard_source(digit_shards, tmp_path):
    """`helm test` runs `probe --deployment FILE` with no location: it used to stop at argument parsing."""
    import yaml

    from chartkit.objects import render

    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"shards": {"server": "bucket", "bucket": {"url": "gs://acme-data/shards"}}}))
    objects = [o for o in yaml.safe_load_all(render([str(values)], release="r")) if o]
    document = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["deployment.yaml"])
    document["shards"]["bucket"]["url"] = str(digit_shards)  # the shard source, here a local directory
    deployment = tmp_path / "deployment.yaml"
    deployment.write_text(yaml.safe_dump(document))
    result = cli("probe", "--deployment", str(deployment))
    assert result.returncode == 0, result.stderr
    assert "1438 train samples in 12 shards" in result.stdout


def test_probe_wait_succeeds_once_a_fill_writes_the_index(digit_shards, tmp_path):
    root = tmp_path / "volume"
    root.mkdir()
    with NginxServer(str(root)) as server:

        def fill() -> None:
            time.sleep(2)
            for path in sorted(digit_shards.iterdir(), key=lambda p: p.suffix == ".json"):  # index last
                shutil.copy(path, root / path.name)

        filler = threading.Thread(target=fill)
        filler.start()
        result = cli("probe", "--wait", "60", f"{server.url}/shards.json", timeout=90)
        filler.join()
    assert result.returncode == 0, result.stderr
    assert "waiting for shards" in result.stdout and "12 shards" in result.stdout


def test_probe_wait_gives_up_with_one_line_naming_the_url(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    with NginxServer(str(root)) as server:
        result = cli("probe", "--wait", "3", f"{server.url}/shards.json", timeout=60)
    assert result.returncode == 2
    assert f"{server.url}/shards.json" in result.stderr and "still failing after 3 s" in result.stderr
    assert result.stderr.count("\n") == 1


def test_launch_waits_for_the_shard_server_before_starting_torchrun(shard_server):
    ready = cli(
        "launch",
        "--nproc-per-node",
        "1",
        "--wait-for",
        f"{shard_server.url}/shards.json",
        "--",
        "summarize",
        f"{shard_server.url}/shards.json",
        timeout=120,
    )
    assert ready.returncode == 0, ready.stderr
    assert ready.stdout.index("shards ready:") < ready.stdout.index("torchrun")
    assert "train: 1438 samples in 12 shards" in ready.stdout


def test_launch_gives_up_on_a_missing_index_without_starting_torchrun(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    with NginxServer(str(root)) as server:
        result = cli("launch", "--wait-for", f"{server.url}/shards.json", "--wait-timeout", "2", "--", "train")
    assert result.returncode == 2 and "torchrun" not in result.stdout
    assert "shards.json: HTTP 404" in result.stderr and result.stderr.count("\n") == 1
