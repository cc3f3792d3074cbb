"""gcp-storage-emulator that serves gzip-encoded objects as GCS does: `python gcs_transcoding.py PORT BUCKET`.

An object uploaded with `Content-Encoding: gzip` is stored compressed. GCS sends it to a client that accepts
gzip with `Content-Encoding: gzip` (and most HTTP clients then inflate it), and inflates it itself for one
that does not (decompressive transcoding): either way the client may receive far more bytes than the
object's listed size. The emulator always sends the stored bytes with no such header; here it transcodes.
An object whose name ends in `.longer` is served with a megabyte of extra bytes after it, as a server that
sends more than it lists.
"""

from __future__ import annotations

import gzip
import sys
from http import HTTPStatus

from gcp_storage_emulator.handlers import objects

_download = objects.download


def _transcoding_download(request, response, storage, *args, **kwargs):
    _download(request, response, storage, *args, **kwargs)
    if response.status != HTTPStatus.OK:
        return
    name = request.params["object_id"]
    obj = storage.get_file_obj(request.params["bucket_name"], name)
    if name.endswith(".longer"):
        response._content = bytes(response._content) + b"\0" * (1 << 20)
    if obj.get("contentEncoding") != "gzip":
        return
    response["X-Goog-Stored-Content-Encoding"] = "gzip"
    if "gzip" in (request.get_header("accept-encoding") or ""):
        response["Content-Encoding"] = "gzip"
    else:
        response._content = gzip.decompress(response._content)


objects.download = _transcoding_download

from gcp_storage_emulator.__main__ import main  # noqa: E402 (after the patch: the server's routes take it)

if __name__ == "__main__":
    port, bucket = sys.argv[1:3]
    sys.exit(main(["start", "--host", "127.0.0.1", "--port", port, "--in-memory", "--default-bucket", bucket]))
