"""A shard server that answers and then trickles: headers at once, then one byte every `every` seconds, as a
stalled proxy or a link that has all but died does. Every socket read sees a byte long before any inactivity
timeout, so only a deadline on the read (a minimum rate) cuts it off."""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path


class TrickleServer:
    """Serves the files of `root` on 127.0.0.1 (Range requests honoured), those ending in one of `slow` (every
    file by default) at one byte every `every` seconds, and only on their first `slow_requests` requests (None:
    all); a context manager that stops the server and its connections on exit."""

    def __init__(self, root: Path, every: float = 2.0, slow: tuple[str, ...] = ("",), slow_requests: int | None = None):
        self.root, self.every, self.slow, self.slow_requests = Path(root), every, slow, slow_requests
        self.stopped = threading.Event()
        self.requests = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                path = server.root / self.path.lstrip("/").split("?", 1)[0]
                if not path.is_file():
                    self.send_error(404)
                    return
                data = path.read_bytes()
                start = int(self.headers.get("Range", "bytes=0-")[6:].split("-", 1)[0] or 0)
                self.send_response(206 if start else 200)
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                trickle = path.name.endswith(server.slow) and (
                    server.slow_requests is None or server.requests <= server.slow_requests
                )
                if not trickle:
                    self.wfile.write(data[start:])
                    return
                for offset in range(start, len(data)):
                    if server.stopped.wait(server.every):
                        return
                    try:
                        self.wfile.write(data[offset : offset + 1])
                        self.wfile.flush()
                    except OSError:
                        return

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> TrickleServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_forever(root: str, every: float, port_file: str) -> None:
    """Run a trickling server until killed, writing its URL to `port_file` (for trying it by hand)."""
    with TrickleServer(Path(root), every) as server:
        Path(port_file).write_text(server.url)
        while True:
            time.sleep(3600)
