"""Reachability checks at start: a source that nothing answers for fails with one
clear message naming its setting, instead of Spark's retries much later."""

from __future__ import annotations

import logging
import socket
import time

from lakesink.errors import SourceError

logger = logging.getLogger(__name__)


def wait_for_tcp(hosts: list[tuple[str, int]], timeout_s: float, *, what: str,
                 key: str) -> None:
    """Return once one of ``hosts`` accepts a TCP connection; after ``timeout_s``
    raise :class:`SourceError` naming ``what`` and the setting ``key``."""
    deadline = time.monotonic() + timeout_s
    last_error = "no address"
    said = False
    while True:
        for host, port in hosts:
            try:
                with socket.create_connection((host, port), timeout=2):
                    return
            except OSError as exc:
                last_error = f"{host}:{port}: {exc.strerror or exc}"
        if time.monotonic() >= deadline:
            waited = f" after {timeout_s:.0f}s" if timeout_s >= 1 else ""
            raise SourceError(f"{what}{waited} ({last_error}); check {key} and the network")
        if not said:  # a wait is said, not silent
            logger.warning("%s (%s); waiting up to %.0f s for it", what, last_error, timeout_s)
            said = True
        time.sleep(1.0)
