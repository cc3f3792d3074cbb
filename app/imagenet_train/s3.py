"""Amazon S3 and S3-compatible stores (MinIO, Ceph RGW, R2) through boto3: shards and indexes read as
streams. Reading only: upload, sync and --results mirroring speak gs://.

Credentials and endpoint come from boto3's usual chain (AWS_ACCESS_KEY_ID/..., AWS_PROFILE, instance or pod
roles; AWS_ENDPOINT_URL for S3-compatible stores); with no credentials at all, requests go unsigned, which
reads public buckets.
"""

from __future__ import annotations

import functools
import io
import time
from typing import BinaryIO

from .errors import ImagenetTrainError


def split(url: str) -> tuple[str, str]:
    """s3://bucket/key → (bucket, key)."""
    bucket, _, key = url[5:].partition("/") if url.startswith("s3://") else ("", "", "")
    if not bucket or not key:
        raise ImagenetTrainError(f"{url}: expected s3://BUCKET/KEY")
    return bucket, key


@functools.lru_cache(maxsize=1)
def client():
    """One client per process (DataLoader workers each make their own)."""
    try:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config
    except ImportError:
        raise ImagenetTrainError("s3:// needs boto3 (pip install 'imagenet-train[s3]')") from None
    session = boto3.session.Session()
    retries = {"max_attempts": 8, "mode": "adaptive"}
    if session.get_credentials() is None:
        return session.client("s3", config=Config(signature_version=UNSIGNED, retries=retries))
    return session.client("s3", config=Config(retries=retries))


def explain(url: str, error: Exception) -> ImagenetTrainError:
    """One line naming the URL and the cause, for any error boto3 raises."""
    code = str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))
    if code in ("NoSuchBucket",):
        return ImagenetTrainError(f"{url}: no such bucket")
    if code in ("NoSuchKey", "404", "NotFound"):
        return ImagenetTrainError(f"{url}: no such object")
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return ImagenetTrainError(
            f"{url}: permission denied (credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
            "or an instance/pod role)"
        )
    return ImagenetTrainError(f"{url}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")


class S3Stream(io.RawIOBase):
    """An object's body that, when a read fails midway, reopens it with a Range from where it broke off."""

    def __init__(self, url: str, retries: int = 5):
        self.url, self.retries = url, retries
        self.bucket, self.key = split(url)
        self.position = 0
        self.body = self._open()

    def _open(self):
        arguments = {"Bucket": self.bucket, "Key": self.key}
        if self.position:
            arguments["Range"] = f"bytes={self.position}-"
        try:
            return client().get_object(**arguments)["Body"]
        except ImagenetTrainError:
            raise
        except Exception as error:
            raise explain(self.url, error) from None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        for attempt in range(self.retries + 1):
            try:
                data = self.body.read(len(buffer))
            except Exception as error:  # botocore's read timeouts, incomplete reads, resets
                if attempt == self.retries:
                    raise ImagenetTrainError(
                        f"{self.url}: read failed at byte {self.position} after retries ({type(error).__name__})"
                    ) from None
                time.sleep(min(30.0, 0.5 * 2**attempt))
                self.body = self._open()
                continue
            buffer[: len(data)] = data
            self.position += len(data)
            return len(data)
        return 0

    def close(self) -> None:
        if not self.closed:
            self.body.close()
        super().close()


def open_read(url: str, retries: int = 5) -> BinaryIO:
    """A buffered streaming reader of one object."""
    return io.BufferedReader(S3Stream(url, retries), buffer_size=1 << 20)
