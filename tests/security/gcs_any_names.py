"""gcp-storage-emulator that keeps any object name, as GCS itself does: `python gcs_any_names.py PORT BUCKET`.

GCS stores a name as an opaque key, so `run/../../x` is a valid object there (whoever can write to a bucket
can create it). The emulator maps names onto a local file tree and refuses such names, and it writes an
object's mediaLink unescaped, so a client reading it back would ask for the wrong URL. Here both are as in
GCS: names are keys of the in-memory store, and the mediaLink escapes the name.
"""

from __future__ import annotations

import sys
import urllib.parse

from gcp_storage_emulator import storage
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.handlers import objects

storage._FileStore._norm = staticmethod(lambda path: path)  # in-memory store: the name is the key
_resource = objects._make_object_resource


def _escaped_media_link(base_url, bucket_name, object_name, *args, **kwargs):
    resource = _resource(base_url, bucket_name, object_name, *args, **kwargs)
    name = urllib.parse.quote(object_name, safe="")
    generation = resource["generation"]
    resource["mediaLink"] = f"{base_url}/download/storage/v1/b/{bucket_name}/o/{name}?generation={generation}&alt=media"
    return resource


objects._make_object_resource = _escaped_media_link

if __name__ == "__main__":
    port, bucket = sys.argv[1:3]
    sys.exit(main(["start", "--host", "127.0.0.1", "--port", port, "--in-memory", "--default-bucket", bucket]))
