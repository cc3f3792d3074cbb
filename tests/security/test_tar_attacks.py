"""Malformed tar headers in a shard: each is a broken shard (counted, the next shard still read), one line under
--on-broken-shard fail, never a hang, a traceback or an allocation the shard chose."""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import resource
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagenet_train.errors import ImagenetTrainError
from imagenet_train.io import tarstream
from imagenet_train.loading.stages import DamageCounters, ShardReading, read_shards

from .bombs import fix_checksums, tar_header, tar_member
from conftest import cli, write_image_folder

GOOD = tar_member(b"ok.jpg", b"\xff\xd8 fine") + tar_member(b"ok.cls", b"1")
GOOD2 = tar_member(b"ok2.jpg", b"\xff\xd8 fine") + tar_member(b"ok2.cls", b"1")
END = bytes(1024)


def pax(records: bytes) -> bytes:
    return tar_member(b"PaxHeader", records, kind=b"x")


MALFORMED = {
    "pax record length 0": pax(b"0 path=x.jpg\n"),
    "pax record length not a number": pax(b"ab path=x.jpg\n"),
    "pax record length past the header": pax(b"999 path=x.jpg\n"),
    "pax record length negative": pax(b"-5 path=x.jpg\n"),
    "pax size not a number": pax(b"12 size=1e9\n"),
    "pax size of an exabyte": pax(b"30 size=999999999999999999\n"),
    "base-256 size of 2^70": tar_header(b"x.jpg", b"\x80" + (1 << 70).to_bytes(11, "big")),
    "base-256 negative size": tar_header(b"x.jpg", b"\xff" * 12),
    "octal size with a minus sign": tar_header(b"x.jpg", b"-0000000001\x00"),
    "member of 1 GiB": tar_header(b"x.jpg", size=1 << 30),
    "GNU long name of 1 MiB": tar_member(b"././@LongLink", b"n" * (1 << 20), kind=b"L"),
}


def shard(tmp_path, name: str, body: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(GOOD + body + GOOD2 + END)
    return str(path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_tar_header_is_a_broken_shard_and_the_next_shard_is_read(tmp_path, case, marker):
    bad = shard(tmp_path, "bad.tar", MALFORMED[case])
    good = shard(tmp_path, "good.tar", b"")
    counters = DamageCounters(multiprocessing.get_context("spawn"))
    keys = [sample["__key__"] for sample in read_shards([bad, good], ShardReading(), counters)]
    assert keys[-2:] == ["ok", "ok2"]  # the next shard, whole
    assert counters.snapshot()[DamageCounters.BROKEN] == 1
    with pytest.raises(ImagenetTrainError, match="bad.tar: broken shard .*--on-broken-shard fail") as raised:
        list(read_shards([bad], ShardReading(on_broken="fail")))
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 400
    assert not marker.exists()


def malformed_index(tmp_path, case: str):
    """A real small shard set whose first train shard carries a malformed header (index updated to match)."""
    source, out = tmp_path / "source", tmp_path / "shards"
    write_image_folder(source, {"n01": 4, "n02": 4})
    assert cli("shards", str(source), str(out), "--maxcount", "4", "--quiet").returncode == 0
    index = json.loads((out / "shards.json").read_text())
    entry = index["splits"]["train"]["shardlist"][0]
    path = out / entry["url"]
    data = path.read_bytes()
    end = _end_marker(data)
    damaged = data[:end] + MALFORMED[case] + bytes(len(data) - end)
    path.write_bytes(damaged)
    entry["filesize"], entry["sha256"] = len(damaged), hashlib.sha256(damaged).hexdigest()
    (out / "shards.json").write_text(json.dumps(index))
    return out


def _end_marker(data: bytes) -> int:
    """Where a tarfile-written archive's end-of-archive blocks start."""
    position = 0
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for info in tar:
            position = info.offset_data + -(-info.size // 512) * 512
    return position


@pytest.mark.timeout(300)
def test_train_over_a_shard_with_a_non_numeric_pax_length_fails_in_one_line_under_fail(tmp_path, marker):
    shards = malformed_index(tmp_path, "pax record length not a number")
    result = cli(
        "train",
        *("--shards", str(shards), "--arch", "resnet18", "--image-size", "16", "--batch-size", "4"),
        *("--val-crop-size", "16"),
        *("--epochs", "1", "--workers", "1", "--mode", "split", "--on-broken-shard", "fail"),
        *("--run-dir", str(tmp_path / "run"), "--no-tensorboard"),
        timeout=280,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("imagenet-train: error:")]
    assert len(lines) == 1 and "broken shard" in lines[0] and "pax header" in lines[0]
    assert not marker.exists()


@pytest.mark.timeout(120)
def test_probe_of_a_shard_with_a_2_pow_70_size_is_one_line_exit_2(tmp_path):
    shards = malformed_index(tmp_path, "base-256 size of 2^70")
    result = cli("probe", str(shards))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "over the" in result.stderr


def real_tar() -> bytes:
    """A small real tar holding what our reader must handle: pax headers and a GNU long name."""
    parts = []
    for fmt, names in ((tarfile.PAX_FORMAT, ["p" * 120 + ".jpg", "ü.cls"]), (tarfile.GNU_FORMAT, ["g" * 130 + ".jpg"])):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
            for name in names:
                info = tarfile.TarInfo(name)
                info.size = 700
                tar.addfile(info, io.BytesIO(bytes(range(256)) * 2 + b"x" * 188))
        parts.append(out.getvalue())
    return parts[0][: _end_marker(parts[0])] + parts[1]


REAL = real_tar()


@st.composite
def mutated_tars(draw) -> bytes:
    data = bytearray(REAL[: draw(st.integers(0, len(REAL)))] if draw(st.booleans()) else REAL)
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        kind = draw(st.sampled_from(["byte", "bytes", "size", "pax-length"]))
        if kind == "byte":
            data[at] = draw(st.integers(0, 255))
        elif kind == "bytes":
            chunk = draw(st.binary(min_size=1, max_size=64))
            data[at : at + len(chunk)] = chunk
        elif kind == "size":  # a header's size field: octal text, base-256 or junk
            block = at - at % 512
            data[block + 124 : block + 136] = draw(
                st.one_of(
                    st.binary(min_size=12, max_size=12),
                    st.integers(0, 2**88 - 1).map(lambda n: b"\x80" + n.to_bytes(11, "big")),
                    st.integers(0, 8**11 - 1).map(lambda n: b"%011o\x00" % n),
                )
            )[: len(data) - block - 124]
        else:  # a pax record's length digits
            found = data.find(b" path=")
            if found > 0:
                digits = str(draw(st.integers(-10, 10**6))).encode()
                data[max(0, found - 3) : found] = digits
    if draw(st.booleans()):
        fix_checksums(data)
    return bytes(data)


@pytest.mark.unit
@pytest.mark.timeout(180)
@settings(max_examples=400, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated_tars(), st.binary(max_size=4096)))
def test_random_and_mutated_tars_give_members_or_a_tar_format_error_only(data):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        for name, member in tarstream.members(io.BytesIO(data)):
            assert isinstance(name, str) and len(member) <= tarstream.MAX_MEMBER_BYTES
    except tarstream.TarFormatError:
        pass
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kb < 128 * 1024, f"peak RSS grew by {grown_kb} KB on {len(data)} bytes of tar"


def test_the_unmutated_tar_reads_like_tarfile():
    with tarfile.open(fileobj=io.BytesIO(REAL)) as reference:
        expected = [(m.name, reference.extractfile(m).read()) for m in reference if m.isreg()]
    assert list(tarstream.members(io.BytesIO(REAL))) == expected and len(expected) == 3
