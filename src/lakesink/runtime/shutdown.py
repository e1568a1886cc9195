"""Graceful shutdown: SIGINT/SIGTERM stop the query after the batch in flight.

The first signal asks for a stop: the driver waits until no trigger is active, then
stops the query (so the batch in flight commits). A second signal stops at once —
still safe, because a batch cut short is redone on restart (see
:mod:`lakesink.tables.base`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

logger = logging.getLogger(__name__)


class StopRequest:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.signals = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signals += 1
        self.event.set()
        logger.warning("%s received: stopping after the current batch%s",
                       signal.Signals(signum).name,
                       "" if self.signals == 1 else " (now: second signal)")

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    @property
    def urgent(self) -> bool:
        return self.signals >= 2


def await_query(query: StreamingQuery, stop: StopRequest, *, poll_s: float = 0.5) -> None:
    """Block until the query ends by itself or a stop was requested and carried out.

    Raises the query's exception if it failed.
    """
    while query.isActive:
        if stop.requested:
            while query.isActive and query.status.get("isTriggerActive") and not stop.urgent:
                time.sleep(0.1)
            query.stop()
            break
        query.awaitTermination(poll_s)
    exc = query.exception()
    if exc is not None:
        raise exc
