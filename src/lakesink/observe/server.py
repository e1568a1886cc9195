"""The HTTP endpoints of a run: ``/`` (the status page), ``/metrics`` (Prometheus text
format), ``/healthz`` and ``/readyz``; a daemon thread, stopped with the run. Nothing it serves carries a
configuration value."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from lakesink.errors import ConfigError

if TYPE_CHECKING:
    from lakesink.observe.health import Health
    from lakesink.observe.metrics import Metrics

logger = logging.getLogger(__name__)


class ObserveServer:
    def __init__(self, host: str, port: int, metrics: Metrics, health: Health) -> None:
        self.metrics = metrics
        self.health = health
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's API
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(server.metrics.registry),
                               CONTENT_TYPE_LATEST)
                elif path == "/":
                    from lakesink.observe.page import render

                    self._send(200, render(server.metrics, server.health).encode(),
                               "text/html; charset=utf-8")
                elif path == "/healthz":
                    self._send(200, b"ok\n")
                elif path == "/readyz":
                    ready, why = server.health.ready()
                    self._send(200 if ready else 503, f"{why}\n".encode())
                else:
                    self._send(404, b"not found: /, /metrics, /healthz, /readyz\n")

            def _send(self, code: int, body: bytes,
                      content_type: str = "text/plain; charset=utf-8") -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                logger.debug("http: " + format, *args)

        try:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError("metrics.port", f"cannot listen on {host}:{port}: "
                              f"{exc.strerror or exc}") from None
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                       name="lakesink-metrics")

    def start(self) -> ObserveServer:
        self.thread.start()
        logger.info("status page on http://%s:%d/ (and /metrics, /healthz, /readyz)",
                    self.httpd.server_address[0], self.port)
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
