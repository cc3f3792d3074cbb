"""Google Cloud Storage through `google-cloud-storage`: streaming reads, verified uploads, listings.

Credentials, in the order the client library tries them: Application Default Credentials
(GOOGLE_APPLICATION_CREDENTIALS key file, workload identity, gcloud), and, when none are found,
anonymous access, which reads public buckets. STORAGE_EMULATOR_HOST points everything at an emulator.
"""

from __future__ import annotations

import base64
import functools
import os
from dataclasses import dataclass
from typing import BinaryIO

from .errors import ImagenetTrainError

CHUNK = 8 * 1024 * 1024


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
    return ImagenetTrainError(f"{url}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")


def missing(url: str) -> ImagenetTrainError:
    """The error for a URL that names nothing: say whether the bucket or only the object is missing."""
    bucket, path = split(url)
    return ImagenetTrainError(f"{url}: {'no such object' if path and _bucket_exists(bucket) else 'no such bucket'}")


def _bucket_exists(bucket: str) -> bool:
    try:
        return client().lookup_bucket(bucket) is not None
    except Exception:
        return True  # cannot tell: say "object"


def open_read(url: str) -> BinaryIO:
    """A streaming reader of one object (chunked ranged reads, retried by the client library)."""
    bucket, path = split(url)
    try:
        blob = client().bucket(bucket).get_blob(path)  # fails here, naming the URL, not mid-read
        if blob is None:
            raise missing(url)
        return blob.open("rb", chunk_size=CHUNK)
    except ImagenetTrainError:
        raise
    except Exception as error:
        raise explain(url, error) from None


def read_bytes(url: str) -> bytes:
    bucket, path = split(url)
    try:
        return client().bucket(bucket).blob(path).download_as_bytes()
    except Exception as error:
        raise explain(url, error) from None


def stat(url: str) -> ObjectInfo | None:
    """Size and checksum of an object, or None when it does not exist."""
    bucket, path = split(url)
    try:
        blob = client().bucket(bucket).get_blob(path)
    except Exception as error:
        raise explain(url, error) from None
    return ObjectInfo(path, blob.size, blob.crc32c) if blob else None


def listing(url: str) -> list[ObjectInfo]:
    """Every object under a gs:// prefix."""
    bucket, prefix = split(url)
    try:
        return [ObjectInfo(b.name, b.size, b.crc32c) for b in client().list_blobs(bucket, prefix=prefix)]
    except Exception as error:
        raise explain(url, error) from None


def file_crc32c(path: str) -> str:
    """A local file's CRC32C, base64 like GCS reports it."""
    import google_crc32c

    checksum = google_crc32c.Checksum()
    with open(path, "rb") as stream:
        while block := stream.read(CHUNK):
            checksum.update(block)
    return base64.b64encode(checksum.digest()).decode()


def upload(path: str, url: str) -> ObjectInfo:
    """Upload a file and verify the stored checksum; an interrupted upload never leaves an object behind."""
    bucket, name = split(url)
    local = file_crc32c(path)
    try:
        blob = client().bucket(bucket).blob(name, chunk_size=CHUNK)
        # Resumable and checksummed: the object only appears once the last chunk is committed.
        blob.upload_from_filename(path, checksum="crc32c")
        blob.reload()
    except Exception as error:
        raise explain(url, error) from None
    if blob.crc32c != local:
        raise ImagenetTrainError(f"{url}: stored checksum {blob.crc32c} differs from {path}'s {local}")
    return ObjectInfo(name, blob.size, blob.crc32c)


def download(url: str, path: str) -> ObjectInfo:
    """Download to a temporary name, verify the checksum, then rename into place."""
    bucket, name = split(url)
    temporary = f"{path}.part{os.getpid()}"
    try:
        blob = client().bucket(bucket).get_blob(name)
        if blob is None:
            raise missing(url)
        blob.download_to_filename(temporary, checksum="crc32c")
    except ImagenetTrainError:
        raise
    except Exception as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise explain(url, error) from None
    if file_crc32c(temporary) != blob.crc32c:
        os.unlink(temporary)
        raise ImagenetTrainError(f"{url}: downloaded bytes do not match the stored checksum")
    os.replace(temporary, path)
    return ObjectInfo(name, blob.size, blob.crc32c)
