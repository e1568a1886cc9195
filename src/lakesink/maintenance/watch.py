"""A running ``lakesink run``'s watch over its table's compaction journal (audit-2 #20a).

A Parquet compaction killed between its ``done`` and its ``finished`` leaves its output
next to its inputs: a reader that lists the folder (DuckDB's glob, a Hive table) counts
those rows twice until someone finishes it. ``compact``, ``vacuum`` and ``repair
--apply`` do, first thing; but a cron loop may not come back for an hour, and a
compaction killed before ``done`` leaves staging and, later, an orphan output. So the
run finishes (or undoes) it too: at start, and then at most every ``every_s`` seconds
after a committed batch, when the journal shows a compaction without its end, a
background thread takes the compactor lease and resumes it — exactly as ``compact``
would (:meth:`~lakesink.maintenance.parquet.ParquetCompactor.resume_locked`). A
compaction that is still running holds that lease: the thread learns so (the lease's
watch, up to its TTL) and leaves it alone. The batches never wait for the thread; its
failures are logged and left to the next check or the next ``compact``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from lakesink.errors import SecondWriterError

logger = logging.getLogger(__name__)


class Resumable(Protocol):
    """A table's compactor (:class:`~lakesink.maintenance.parquet.ParquetCompactor`)."""

    table: str

    def crashed(self) -> bool: ...

    def resume_unfinished(self) -> tuple[list[int], list[int]]: ...


class CompactionWatch:
    """See the module docstring. :meth:`poke` after each committed batch (and once at
    start); :meth:`close` when the run stops."""

    def __init__(self, compactor: Resumable, every_s: float = 60.0) -> None:
        self.compactor = compactor
        self.every_s = every_s
        self._checked: float | None = None
        self._thread: threading.Thread | None = None

    def poke(self) -> None:
        """Start a check unless one ran in the last ``every_s`` or is running."""
        now = time.monotonic()
        if (self._checked is not None and now - self._checked < self.every_s) \
                or (self._thread is not None and self._thread.is_alive()):
            return
        self._checked = now
        self._thread = threading.Thread(target=self._check, daemon=True,
                                        name="lakesink-compaction-watch")
        self._thread.start()

    def _check(self) -> None:
        table = self.compactor.table
        try:
            if not self.compactor.crashed():
                return
            forward, back = self.compactor.resume_unfinished()
        except SecondWriterError:
            logger.info("%s: a compaction is running (it holds the compactor lease); "
                        "left to it", table)
            return
        except Exception as exc:  # noqa: BLE001 - the next check, or compact, retries
            logger.warning("%s: could not resume a compaction left unfinished: %s "
                           "(the next check or `lakesink compact` does)", table, exc)
            return
        if forward or back:
            logger.warning("%s: compaction(s) a killed compactor left unfinished resumed: "
                           "finished %s, undone %s", table, forward or "none",
                           back or "none")

    def wait(self, timeout_s: float | None = None) -> None:
        """Until the running check (if any) ends."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def close(self) -> None:
        """The run stops: a check still running is given a few seconds (what it leaves
        half done, the next resume finishes: every step is idempotent)."""
        self.wait(5.0)
