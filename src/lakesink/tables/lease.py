"""One writer per table where the store cannot arbitrate: a lease file.

Delta on S3 with the default single-driver log store is only safe with one writer: S3
has no put-if-absent that this log store uses, so two drivers committing the same
version silently lose one commit. lakesink holds a lease while it writes such a table
and refuses to start a second writer that it can see.

The lease is ``<base>/.lakesink/<table>/writer.json``: ``{writer, app_id, host, pid,
renewed, ttl_s}``, created with a conditional PUT (``If-None-Match: *``), renewed every
``ttl_s / 3`` seconds, deleted on a clean stop. A lease is **stale** — and is taken over,
with a warning — when it was not renewed for ``ttl_s``, or when it names this host and a
process that no longer runs (a crash, then a restart on the same machine, goes on at
once). Otherwise the start is refused, naming the holder. A writer that finds its lease
taken over (it stalled past the TTL) logs an error: another writer may be on the table.

This is detection, not a consensus protocol: two starts within the same few
milliseconds, or a stalled writer coming back, are not fully excluded. For several
writers on one table, use the DynamoDB log store (``table.delta_log_store``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from lakesink.errors import LakesinkError

if TYPE_CHECKING:
    from lakesink.tables.fs import HadoopFS

logger = logging.getLogger(__name__)


class SecondWriterError(LakesinkError):
    """Another live writer holds the table."""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


class WriterLease:
    def __init__(self, fs: HadoopFS, path: str, *, app_id: str, ttl_s: float,
                 table: str, refusal: str | None = None) -> None:
        """``refusal``: why a second holder is refused (default: the Delta-on-S3
        reason), said in the error."""
        self.fs = fs
        self.path = path
        self.app_id = app_id
        self.ttl_s = ttl_s
        self.table = table
        self.refusal = refusal or ("A second writer on one Delta table on S3 would lose "
                                   "commits with the single-driver log store.")
        self.writer = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self) -> str:
        return json.dumps({"writer": self.writer, "app_id": self.app_id,
                           "host": socket.gethostname(), "pid": os.getpid(),
                           "renewed": time.time(), "ttl_s": self.ttl_s})

    def stale(self, held: dict[str, Any], now: float) -> bool:
        if now - float(held.get("renewed", 0)) > float(held.get("ttl_s", self.ttl_s)):
            return True
        return held.get("host") == socket.gethostname() and not pid_alive(int(held["pid"]))

    def acquire(self) -> None:
        """Hold the lease, or raise SecondWriterError naming the live holder."""
        for _ in range(3):
            if self.fs.write_once(self.path, self._record()):
                self._start_renewing()
                return
            held = self.fs.read_json(self.path)
            if held is None:  # released meanwhile
                continue
            if self.stale(held, time.time()):
                logger.warning("taking over the stale writer lease of %s (host %s, pid %s, "
                               "renewed %.0fs ago)", self.table, held.get("host"),
                               held.get("pid"), time.time() - float(held.get("renewed", 0)))
                self.fs.delete(self.path, recursive=False)
                continue
            age = time.time() - float(held.get("renewed", 0))
            raise SecondWriterError(
                f"table {self.table} is being written by another lakesink (host "
                f"{held.get('host')}, pid {held.get('pid')}, checkpoint app id "
                f"{held.get('app_id')}, lease renewed {age:.0f}s ago). {self.refusal} Stop "
                f"the other writer; if it died on another machine, its lease expires "
                f"{max(0.0, float(held.get('ttl_s', self.ttl_s)) - age):.0f}s from now; for "
                "several writers use table.delta_log_store: dynamodb")
        raise SecondWriterError(f"could not take the writer lease of {self.table} "
                                f"({self.path}); another writer keeps taking it")

    def _start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew, name=f"lease-{self.table}",
                                        daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                held = self.fs.read_json(self.path)
                if held is not None and held.get("writer") != self.writer:
                    logger.error("the writer lease of %s was taken over by host %s pid %s: "
                                 "another writer may be on this table", self.table,
                                 held.get("host"), held.get("pid"))
                    return
                self.fs.write_text(self.path, self._record())
            except Exception as exc:  # a storage hiccup: try again next round
                logger.warning("could not renew the writer lease of %s: %s", self.table, exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is None:
            return
        self._thread.join(10)
        self._thread = None
        try:
            held = self.fs.read_json(self.path)
            if held is not None and held.get("writer") == self.writer:
                self.fs.delete(self.path, recursive=False)
        except Exception as exc:
            logger.warning("could not release the writer lease of %s: %s", self.table, exc)
