"""Issue 50's peers: our loader against MosaicML streaming and LitData, each with its own writer and reader, from
local disk and from one S3 server on 127.0.0.1, into docs/benchmarks.md (part of `make bench`).

python bench/peers.py [--images 2600] [--rounds 3] [--workers 2] [--workdir bench/.work] [--out docs/benchmarks.md]

Needs the peers (bench/peers-requirements.txt; `make bench` installs them into bench/.peers) and moto's server
(the dev extra). Each round converts with the three writers, then reads with the three loaders (ours twice from
S3: streaming, and with --cache-dir), each read in a fresh process (bench/peers_read.py), in the same order.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent / "tools"))  # local_server

import common  # noqa: E402
import pages  # noqa: E402
import peers_read  # noqa: E402,F401  (puts bench/.peers on sys.path)
import peers_table  # noqa: E402
from local_server import NoAnswer, serving  # noqa: E402

from imagenet_train.datasets.convert import ShardOptions  # noqa: E402
from imagenet_train.datasets.convert import convert as make_shards  # noqa: E402
from imagenet_train.errors import ImagenetTrainError  # noqa: E402
from imagenet_train.ops.serve import free_port  # noqa: E402

BUCKET = "peers"
SHARD_IMAGES = 200  # ours: as P1's shards
CHUNK = "64MB"  # LitData has no default; MDSWriter's default size_limit is 64 MB (1 << 26)
S3_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def labelled(images: Path) -> list[tuple[str, int]]:
    """(path, class index) of every JPEG under images/train, classes numbered in sorted folder order."""
    folders = sorted(p for p in (images / "train").iterdir() if p.is_dir())
    return [(str(path), label) for label, folder in enumerate(folders) for path in sorted(folder.glob("*.JPEG"))]


def record(item: tuple[str, int]) -> dict:
    """One sample as both peers store it: the JPEG's bytes untouched and its label."""
    path, label = item
    return {"jpg": Path(path).read_bytes(), "cls": label}


def write_ours(images: Path, out: Path, workers: int) -> None:
    make_shards(str(images), str(out), ShardOptions(maxcount=SHARD_IMAGES, workers=workers), progress=False)


def write_mosaicml(images: Path, out: Path, workers: int) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"jpg": "bytes", "cls": "int"}) as writer:
        for item in labelled(images):
            writer.write(record(item))


def write_litdata(images: Path, out: Path, workers: int) -> None:
    from litdata import optimize

    optimize(
        fn=record, inputs=labelled(images), output_dir=str(out), chunk_bytes=CHUNK, num_workers=workers, verbose=False
    )


WRITERS: dict[str, Callable[[Path, Path, int], None]] = {
    "ours": write_ours,
    "mosaicml": write_mosaicml,
    "litdata": write_litdata,
}


def convert_round(images: Path, data: Path, workers: int) -> dict[str, float]:
    """Seconds each writer takes over the same images, into a fresh folder each."""
    seconds = {}
    for name, write in WRITERS.items():
        out = data / name
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        write(images, out, workers)
        seconds[name] = time.perf_counter() - start
    return seconds


@contextmanager
def s3_server(work: Path) -> Iterator[dict[str, str]]:
    """moto's S3 server on a free 127.0.0.1 port, and the environment that points all three loaders at it."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    moto = Path(sys.executable).with_name("moto_server")
    if not moto.exists():
        raise ImagenetTrainError(f"{moto}: moto's server is missing; install the dev extra (make venv)")
    with (work / "moto.log").open("wb") as log:
        try:
            with serving([str(moto), "-H", "127.0.0.1", "-p", str(port)], endpoint, 120, log):
                # AWS_ENDPOINT_URL: boto3 (ours, LitData); S3_ENDPOINT_URL: MosaicML.
                yield {**S3_KEYS, "AWS_ENDPOINT_URL": endpoint, "S3_ENDPOINT_URL": endpoint}
        except NoAnswer as error:
            raise ImagenetTrainError(f"{endpoint}: moto's S3 server did not answer ({error})") from None


def upload(data: Path, environment: dict[str, str]) -> dict[str, str]:
    """Every loader's folder into the bucket; the s3:// URL each loader reads."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=environment["AWS_ENDPOINT_URL"],
        aws_access_key_id=S3_KEYS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"],
        region_name=S3_KEYS["AWS_DEFAULT_REGION"],
    )
    client.create_bucket(Bucket=BUCKET)
    for name in WRITERS:
        for path in sorted(p for p in (data / name).rglob("*") if p.is_file()):
            client.upload_file(str(path), BUCKET, f"{name}/{path.relative_to(data / name)}")
    return {name: f"s3://{BUCKET}/{name}" for name in WRITERS}


def read(loader: str, where: str, cache: bool, workers: int, environment: dict[str, str]) -> dict:
    """One read (bench/peers_read.py) in a fresh process, with an empty cache folder when `cache`."""
    with tempfile.TemporaryDirectory(prefix=f"peers-{loader}-") as folder:
        command = [sys.executable, str(HERE / "peers_read.py"), loader, where, folder if cache else "", "--workers"]
        done = subprocess.run(
            [*command, str(workers)], stdout=subprocess.PIPE, env={**os.environ, **environment}, text=True
        )
    if done.returncode:
        raise ImagenetTrainError(f"bench/peers_read.py {loader} {where}: exit {done.returncode} (its error above)")
    return json.loads(done.stdout.strip().splitlines()[-1])


def reads_round(data: Path, urls: dict[str, str], workers: int, environment: dict[str, str]) -> dict[str, dict]:
    """Each loader once from local disk, then from S3 (ours streaming, then with its cache), in a fixed order."""
    local = {name: read(name, str(data / name), False, workers, {}) for name in WRITERS}
    s3 = {"ours": read("ours", urls["ours"], False, workers, environment)}
    s3["ours_cache"] = read("ours", urls["ours"], True, workers, environment)
    s3 |= {name: read(name, urls[name], True, workers, environment) for name in ("mosaicml", "litdata")}
    return {"local": local, "s3": s3}


def versions() -> dict[str, str]:
    from importlib.metadata import version

    import imagenet_train

    return {
        "ours": getattr(imagenet_train, "__version__", version("imagenet-train")),
        "mosaicml": version("mosaicml-streaming"),
        "litdata": version("litdata"),
    }


def measure(images: Path, work: Path, rounds: int, workers: int, publish: Callable[[dict], None]) -> None:
    """Every round's conversion and reads, interleaved; after each round, `publish` gets the rounds so far with
    the load average at the start and now (a run cut short still leaves what it measured)."""
    data = work / "peers"
    load = os.getloadavg()[0]
    results: dict = {"convert": {name: [] for name in WRITERS}, "reads": {"local": {}, "s3": {}}}
    urls: dict[str, str] = {}
    with s3_server(work) as environment:
        for index in range(rounds):
            for name, seconds in convert_round(images, data, workers).items():
                results["convert"][name].append(seconds)
            urls = urls or upload(data, environment)  # the first round's output; later rounds write the same
            for place, runs in reads_round(data, urls, workers, environment).items():
                for name, run in runs.items():
                    results["reads"][place].setdefault(name, []).append(run)
            publish({**results, "rounds": index + 1, "load": [round(load, 2), round(os.getloadavg()[0], 2)]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2600, help="ImageNet-like JPEGs (bench/common.py), as P1")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--workers", type=int, default=2, help="loader and writer workers, the same for all three")
    parser.add_argument("--workdir", default="bench/.work")
    parser.add_argument("--out", default="docs/benchmarks.md")
    args = parser.parse_args()
    try:
        import litdata  # noqa: F401
        import streaming  # noqa: F401
    except ImportError as error:
        parser.error(f"{error.name} is missing: `make bench` installs bench/peers-requirements.txt into bench/.peers")
    work = Path(args.workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    images = common.imagenet_like(work / "images", args.images)
    about = {"images": args.images, "asked": args.rounds, "workers": args.workers, "versions": versions()}
    about["machine"] = common.machine()

    def publish(results: dict) -> None:
        results |= {**about, "date": datetime.date.today().isoformat()}
        (work / "peers.json").write_text(json.dumps(results, indent=1))
        out = Path(args.out)
        old = out.read_text() if out.exists() else "# Benchmarks\n"
        out.write_text(pages.replace_section(old, peers_table.HEADING, peers_table.block(results)))
        print(f"round {results['rounds']} of {args.rounds}: wrote {out}", flush=True)

    measure(images, work, args.rounds, args.workers, publish)


if __name__ == "__main__":
    main()
