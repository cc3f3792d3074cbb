"""Google Cloud Storage through `google-cloud-storage`: streaming reads, verified uploads, listings.

Credentials, in the order the client library tries them: Application Default Credentials
(GOOGLE_APPLICATION_CREDENTIALS key file, workload identity, gcloud), and, when none are found,
anonymous access, which reads public buckets. STORAGE_EMULATOR_HOST points everything at an emulator.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from stat import S_ISREG
from typing import TypeVar

from imagenet_train.errors import ImagenetTrainError, visible
from imagenet_train.io.atomic import atomic_write, replacing, write_failed
from imagenet_train.io.owned import private_folder
from imagenet_train.io.resumable import Opened, Transient, call, is_local
from imagenet_train.limits import IO_TIMEOUT

T = TypeVar("T")

CHUNK = 8 * 1024 * 1024
QUANTUM = 256 * 1024  # GCS commits resumable uploads in multiples of this
RESUMABLE_MIN = 32 * 1024 * 1024  # smaller files just start over after an interruption


@dataclass(frozen=True)
class ObjectInfo:
    name: str
    size: int
    crc32c: str  # base64, as GCS reports it


def split(url: str) -> tuple[str, str]:
    """gs://bucket/path → (bucket, path)."""
    if not url.startswith("gs://") or len(url) <= 5:
        raise ImagenetTrainError(f"{url}: expected gs://BUCKET/PATH")
    bucket, _, path = url[5:].partition("/")
    if not bucket:
        raise ImagenetTrainError(f"{url}: expected gs://BUCKET/PATH")
    return bucket, path


@functools.lru_cache(maxsize=1)
def client():
    """One client per process (DataLoader workers each make their own after the fork)."""
    try:
        from google.cloud import storage
    except ImportError:
        raise ImagenetTrainError("gs:// needs google-cloud-storage (pip install 'imagenet-train[gcs]')") from None
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            project=os.environ.get("GOOGLE_CLOUD_PROJECT", "emulator"), credentials=AnonymousCredentials()
        )
    import google.auth.exceptions

    try:
        return storage.Client()
    except google.auth.exceptions.DefaultCredentialsError:
        return storage.Client.create_anonymous_client()


def explain(url: str, error: Exception) -> ImagenetTrainError:
    """One line naming the URL and the cause, for any error the client library raises."""
    from google.api_core import exceptions

    code = getattr(error, "code", None)
    if isinstance(error, exceptions.NotFound):
        return missing(url)
    if isinstance(error, exceptions.Forbidden | exceptions.Unauthorized) or code in (401, 403):
        return ImagenetTrainError(
            f"{url}: permission denied (credentials: GOOGLE_APPLICATION_CREDENTIALS, workload identity, "
            "or gcloud auth application-default login)"
        )
    return ImagenetTrainError(f"{url}: {type(error).__name__}: {visible(str(error).splitlines()[0][:200])}")


def missing(url: str) -> ImagenetTrainError:
    """The error for a URL that names nothing: say whether the bucket or only the object is missing."""
    bucket, path = split(url)
    return ImagenetTrainError(f"{url}: {'no such object' if path and _bucket_exists(bucket) else 'no such bucket'}")


def _bucket_exists(bucket: str) -> bool:
    try:
        return client().lookup_bucket(bucket) is not None
    except Exception:
        return True  # cannot tell: say "object"


def transient(error: Exception) -> bool:
    """Whether a client-library error is an outage (worth waiting out) rather than a wrong request."""
    import google.auth.exceptions
    from google.api_core import exceptions

    if isinstance(error, exceptions.ServerError | exceptions.TooManyRequests) or getattr(error, "code", None) == 408:
        return True
    if isinstance(error, exceptions.GoogleAPICallError):
        return False
    return isinstance(error, OSError | ConnectionError | TimeoutError | google.auth.exceptions.TransportError)


def _outage_or_error(url: str, error: Exception) -> Exception:
    if transient(error):
        return Transient(f"{type(error).__name__}: {str(error).splitlines()[0][:160]}")
    return explain(url, error)


class _Body:
    """A BlobReader whose outage errors are marked Transient for the resumable reader."""

    def __init__(self, reader, url: str):
        self.reader, self.url = reader, url

    def read(self, size: int) -> bytes:
        try:
            return self.reader.read(size)
        except Exception as error:
            raise _outage_or_error(self.url, error) from None

    def close(self) -> None:
        self.reader.close()


def opener(url: str) -> Callable[[int], Opened]:
    """`open_at(position)` for one object: chunked ranged reads; retries are ours, so outages are logged."""
    bucket, path = split(url)

    def open_at(position: int) -> Opened:
        try:
            blob = client().bucket(bucket).get_blob(path, retry=None)  # fails here, naming the URL, not mid-read
            if blob is None:
                raise missing(url)
            reader = blob.open("rb", chunk_size=CHUNK, retry=None)
            if position:
                reader.seek(position)
        except ImagenetTrainError:
            raise
        except Exception as error:
            raise _outage_or_error(url, error) from None
        return Opened(_Body(reader, url), blob.size - position, blob.size)

    return open_at


def _waiting_out_outages(url: str, io_timeout: float, action: Callable[[], T]) -> T:
    """`action()` with the client's errors sorted: outages are retried for `io_timeout` s, the rest fail."""

    def attempt() -> T:
        try:
            return action()
        except ImagenetTrainError:
            raise
        except Exception as error:
            if is_local(error):  # this machine's files (a pruned checkpoint, a read-only disk): not an outage
                raise
            raise _outage_or_error(url, error) from None

    return call(url, io_timeout, attempt)


def stat(url: str, io_timeout: float = IO_TIMEOUT) -> ObjectInfo | None:
    """Size and checksum of an object, or None when it does not exist."""
    bucket, path = split(url)
    blob = _waiting_out_outages(url, io_timeout, lambda: client().bucket(bucket).get_blob(path, retry=None))
    return ObjectInfo(path, blob.size, blob.crc32c) if blob else None


def listing(url: str, io_timeout: float = IO_TIMEOUT) -> list[ObjectInfo]:
    """Every object under a gs:// prefix."""
    bucket, prefix = split(url)
    return _waiting_out_outages(
        url,
        io_timeout,
        lambda: [ObjectInfo(b.name, b.size, b.crc32c) for b in client().list_blobs(bucket, prefix=prefix)],
    )


def file_crc32c(path: str) -> str:
    """A local file's CRC32C, base64 like GCS reports it."""
    import google_crc32c

    checksum = google_crc32c.Checksum()
    with open(path, "rb") as stream:
        while block := stream.read(CHUNK):
            checksum.update(block)
    return base64.b64encode(checksum.digest()).decode()


def upload(path: str, url: str, io_timeout: float = IO_TIMEOUT) -> ObjectInfo:
    """Upload a file and verify the stored checksum; an interrupted upload never leaves an object behind.

    Files of RESUMABLE_MIN bytes and more go through a resumable session remembered on disk, so an upload
    killed midway (a preempted node, Ctrl-C) continues from the last committed chunk when run again.
    """
    bucket, name = split(url)
    local = file_crc32c(path)

    def send():
        blob = client().bucket(bucket).blob(name, chunk_size=upload_chunk())
        if os.path.getsize(path) >= RESUMABLE_MIN:
            _upload_resumable(blob, path, url)  # after an outage: continues from the last committed chunk
        else:
            blob.upload_from_filename(path, checksum="crc32c")
        blob.reload()
        return blob

    blob = _waiting_out_outages(url, io_timeout, send)
    if blob.crc32c != local:
        raise ImagenetTrainError(f"{url}: stored checksum {blob.crc32c} differs from {path}'s {local}")
    return ObjectInfo(name, blob.size, blob.crc32c)


def upload_chunk() -> int:
    """Bytes per resumable chunk: IMAGENET_TRAIN_GCS_CHUNK (a multiple of 256 KiB), else 8 MiB."""
    value = int(os.environ.get("IMAGENET_TRAIN_GCS_CHUNK") or CHUNK)
    if value <= 0 or value % QUANTUM:
        raise ImagenetTrainError(f"IMAGENET_TRAIN_GCS_CHUNK={value}: expected a positive multiple of {QUANTUM}")
    return value


def sessions_dir() -> str:
    """The folder of resumable-upload sessions: IMAGENET_TRAIN_UPLOAD_SESSIONS, else one in the user's cache.

    A session's URL lets whoever reads it write the object, so the folder is this user's and 0700 (a root-owned
    shared folder such as /tmp gets a private one inside, another user's folder is one error line: io/owned.py)
    and each record is 0600, replaced by rename and read without following a link."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    chosen = os.environ.get("IMAGENET_TRAIN_UPLOAD_SESSIONS") or os.path.join(base, "imagenet-train", "uploads")
    why = "a session record lets its reader write the object"
    return private_folder(chosen, "upload sessions folder", why, mode=0o700)


def _session_file(path: str, url: str) -> str:
    stat = os.stat(path)
    key = f"{url}\0{os.path.abspath(path)}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return os.path.join(sessions_dir(), hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")


def _persisted(answer) -> int:
    """Bytes a 308 answer says the server holds."""
    persisted = answer.headers.get("Range")
    if not persisted:
        return 0
    end = int(persisted.rsplit("-", 1)[1]) + 1
    # GCS only ever commits whole 256 KiB units before the last chunk; gcp-storage-emulator answers
    # "bytes=0-0" for an empty session, which this reads as 0.
    return end - end % QUANTUM


def _committed(session, upload_url: str, size: int) -> int | None:
    """Bytes the server holds for a session (None: the session expired or is unknown)."""
    answer = session.put(upload_url, headers={"Content-Range": f"bytes */{size}"})
    if answer.status_code in (200, 201):
        return size
    return _persisted(answer) if answer.status_code == 308 else None


def _upload_resumable(blob, path: str, url: str) -> None:
    size = os.path.getsize(path)
    record_path = _session_file(path, url)
    session = client()._http
    record = _read_record(record_path)
    offset = _committed(session, record["session"], size) if record else None
    if record is None or offset is None:
        record = {"url": url, "path": os.path.abspath(path), "size": size}
        record["session"] = blob.create_resumable_upload_session(size=size)
        offset = 0
    elif offset:
        print(f"{url}: resuming an interrupted upload at {offset} of {size} bytes", flush=True)
    chunk = upload_chunk()
    with open(path, "rb") as stream:
        while offset < size:
            _write_json(record_path, {**record, "committed": offset})
            stream.seek(offset)
            data = stream.read(chunk)
            end = offset + len(data) - 1
            answer = session.put(
                record["session"], data=data, headers={"Content-Range": f"bytes {offset}-{end}/{size}"}
            )
            if answer.status_code in (200, 201):
                offset = size
            elif answer.status_code == 308 and _persisted(answer) > offset:
                offset = _persisted(answer)
            elif answer.status_code >= 500 or answer.status_code == 429:
                raise Transient(f"upload chunk at {offset}: HTTP {answer.status_code}")
            else:
                raise ImagenetTrainError(f"{url}: upload chunk at {offset} refused (HTTP {answer.status_code})")
    os.unlink(record_path)


MAX_RECORD = 64 << 10  # a session record is a few hundred bytes


def _read_record(path: str) -> dict | None:
    """The session record at `path`, read without following a link; None when absent or not one we wrote."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(handle, "rb") as stream:
        try:
            record = json.loads(stream.read(MAX_RECORD + 1)) if S_ISREG(os.fstat(handle).st_mode) else None
        except (ValueError, RecursionError):
            return None
    return record if isinstance(record, dict) and isinstance(record.get("session"), str) else None


def _write_json(path: str, data: dict) -> None:
    with atomic_write(path, "w", private=True) as stream:
        json.dump(data, stream)


class _ListedSizeFile:
    """The file a download writes: refuses bytes past the object's listed size as they arrive, and turns a
    failed write into a local error naming the file and the free space (never an outage to wait out)."""

    def __init__(self, stream, url: str, path: str, size: int):
        self.stream, self.url, self.path, self.size = stream, url, path, size
        self.count = 0

    def write(self, data) -> int:
        self.count += len(data)
        if self.count > self.size:
            raise ImagenetTrainError(
                f"{self.url}: the bucket sent more than the {self.size} bytes it lists for this object "
                "(transcoded or replaced); refused"
            )
        try:
            return self.stream.write(data)
        except OSError as error:
            raise write_failed(self.path, error, "cannot write download") from None

    def tell(self) -> int:
        return self.count

    def flush(self) -> None:
        self.stream.flush()


def download(url: str, path: str, io_timeout: float = IO_TIMEOUT, private: bool = False) -> ObjectInfo:
    """Download the object's stored bytes to a temporary name, verify the checksum, then rename into place.

    The stored bytes, never a transcoded form: an object stored with `Content-Encoding: gzip` is written as
    it is stored (GCS would otherwise send it inflated, of any size). The write stops at the listed size.
    `private`: the file is 0600, in a folder of this user closed to others' writes (atomic.replacing).
    """
    bucket, name = split(url)
    try:
        with replacing(path, private) as temporary:

            def fetch():
                blob = client().bucket(bucket).get_blob(name, retry=None)
                if blob is None:
                    raise missing(url)
                with open(temporary, "wb") as stream:  # truncates what a failed attempt left
                    sink = _ListedSizeFile(stream, url, path, blob.size)
                    blob.download_to_file(sink, raw_download=True, checksum="crc32c")
                return blob

            blob = _waiting_out_outages(url, io_timeout, fetch)
            if os.path.getsize(temporary) != blob.size or file_crc32c(temporary) != blob.crc32c:
                raise ImagenetTrainError(f"{url}: downloaded bytes do not match the stored size and checksum")
    except OSError as error:  # the temporary file, its fsync or the rename: this machine's disk
        raise write_failed(path, error, "cannot write download") from None
    return ObjectInfo(name, blob.size, blob.crc32c)
