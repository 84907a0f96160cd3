"""A file server on 127.0.0.1 for download tests, with two faults on request.

``/cut/<file>`` announces the whole file, sends half and hangs up; ``/slow/<file>`` waits 0.5 s
first (so racing clients are mid-download at once).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Handler(SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        self.requests.append(self.path)
        if self.path.startswith("/slow/"):
            time.sleep(0.5)
            self.path = self.path[len("/slow") :]
        if self.path.startswith("/cut/"):
            body = (Path(self.directory) / self.path[len("/cut/") :]).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
            return
        super().do_GET()


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[tuple[str, list[str]]]:
    """Serve ``directory`` on 127.0.0.1: (base URL, the list of paths requested), until the block ends."""
    requests: list[str] = []
    handler = type("Handler", (_Handler,), {"requests": requests})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", requests
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
