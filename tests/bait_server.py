"""A local HTTP server on 127.0.0.1 for media-fetching tests: counts every connection it
accepts (SSRF tests assert it saw none), serves a PNG at ``/image.png``, drips bytes slowly at
``/drip`` (and notes when a dripping client went away), and redirects at ``/redirect?to=URL``."""

from __future__ import annotations

import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from PIL import Image


def png_bytes(
    size: tuple[int, int] = (24, 20), color: tuple[int, int, int] = (10, 200, 90)
) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def setup(self) -> None:
        with self.server.lock:
            self.server.connections += 1
        super().setup()

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        url = urlparse(self.path)
        self.server.hosts.append(self.headers.get("Host", ""))
        if url.path == "/image.png":
            body = png_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif url.path == "/drip":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            try:
                for _ in range(200):
                    self.wfile.write(b"\0")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                self.server.drips_abandoned += 1
        elif url.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", parse_qs(url.query)["to"][0])
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_error(404)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.connections = 0
        self.drips_abandoned = 0
        self.hosts: list[str] = []


class BaitServer:
    """Context manager running ``_Server`` in a thread; ``url`` is its base URL."""

    def __init__(self) -> None:
        self._server = _Server()
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def connections(self) -> int:
        return self._server.connections

    @property
    def hosts(self) -> list[str]:
        """The Host header of every GET, in order."""
        return self._server.hosts

    @property
    def drips_abandoned(self) -> int:
        return self._server.drips_abandoned

    def __enter__(self) -> BaitServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
