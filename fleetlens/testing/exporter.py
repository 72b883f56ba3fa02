"""A page served on loopback as an exporter serves it (dcgm-exporter's ``/metrics``): recorded
output read by the real scraping code, for the machines that have no GPU."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["serve_page"]


@contextlib.contextmanager
def serve_page(body: bytes, content_type: str = "text/plain; version=0.0.4") -> Iterator[str]:
    """Serve ``body`` for every GET on a loopback port; yields the ``/metrics`` URL."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}/metrics"
    finally:
        httpd.shutdown()
        httpd.server_close()
