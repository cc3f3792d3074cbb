"""Reading and writing remote data: URL schemes (file, http(s), gs, s3, ais, pipe), the one resumable
reader, tar reading, the node-local cache, bucket transfers."""
