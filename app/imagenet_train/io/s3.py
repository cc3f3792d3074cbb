"""Amazon S3 and S3-compatible stores (MinIO, Ceph RGW, R2) through boto3: shards and indexes read as
streams (outages waited out, a broken read resumed with a Range). Reading only: upload, sync and --results
mirroring speak gs://.

Credentials and endpoint come from boto3's usual chain (AWS_ACCESS_KEY_ID/..., AWS_PROFILE, instance or pod
roles; AWS_ENDPOINT_URL for S3-compatible stores); with no credentials at all, requests go unsigned, which
reads public buckets.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from imagenet_train.errors import ImagenetTrainError, visible
from imagenet_train.io.resumable import Opened, Transient


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
    return ImagenetTrainError(f"{url}: {type(error).__name__}: {visible(str(error).splitlines()[0][:200])}")


PERMANENT_CODES = (
    "NoSuchBucket",
    "NoSuchKey",
    "404",
    "NotFound",
    "AccessDenied",
    "403",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidRange",
    "InvalidBucketName",
)


def _outage_or_error(url: str, error: Exception) -> Exception:
    """boto3 errors: a missing object or bad credentials fail at once; anything else is an outage."""
    code = str(getattr(error, "response", {}).get("Error", {}).get("Code", ""))
    if code in PERMANENT_CODES or type(error).__name__ in ("NoCredentialsError", "ParamValidationError"):
        return explain(url, error)
    return Transient(f"{type(error).__name__}: {str(error).splitlines()[0][:160]}")


class _Body:
    """A StreamingBody whose read errors (timeouts, resets, incomplete reads) are marked as outages, and which
    refuses bytes past the length the answer announced.

    botocore hands over the stored bytes as they are (an object stored with `Content-Encoding: gzip` is not
    inflated), so what arrives is bounded by the object's listed size.
    """

    def __init__(self, body, url: str, length: int | None):
        self.body, self.url, self.left = body, url, length

    def read(self, size: int) -> bytes:
        try:
            data = self.body.read(size)
        except Exception as error:
            raise _outage_or_error(self.url, error) from None
        self.left = None if self.left is None else self.left - len(data)
        if self.left is not None and self.left < 0:
            raise ImagenetTrainError(f"{self.url}: the store sent more bytes than the object's listed length; refused")
        return data

    def close(self) -> None:
        self.body.close()


def opener(url: str) -> Callable[[int], Opened]:
    """`open_at(position)` for one object: a GetObject, with a Range past the first byte."""
    bucket, key = split(url)

    def open_at(position: int) -> Opened:
        arguments = {"Bucket": bucket, "Key": key}
        if position:
            arguments["Range"] = f"bytes={position}-"
        try:
            answer = client().get_object(**arguments)
        except ImagenetTrainError:
            raise
        except Exception as error:
            raise _outage_or_error(url, error) from None
        remaining = int(answer.get("ContentLength") or 0)
        total = str(answer.get("ContentRange", "")).rpartition("/")[2]
        size = int(total) if total.isdigit() else (remaining if not position else None)
        length = answer.get("ContentLength")
        return Opened(_Body(answer["Body"], url, None if length is None else int(length)), remaining, size)

    return open_at
