"""Graceful shutdown: SIGINT/SIGTERM stop the query after the batch in flight.

The first signal asks for a stop. From then on every batch that starts is refused by
:class:`StopGate` before it reads or writes anything (it raises; Spark has logged the
batch's offsets but not its commit, so the next start reads the same records again),
and the driver stops the query once no trigger is active. So the batch in flight
commits and the stop comes right after it, even when batches run back to back (a
backlog, or batches slower than the trigger interval) and Spark is never idle between
triggers. A second signal stops at once — still safe, because a batch cut short is
redone on restart (see :mod:`lakesink.tables.base`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from lakesink.errors import BatchRefused

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
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


#: the text of a refused batch's error (found again in the query's exception)
REFUSED = "lakesink: batch refused, a stop was requested"


def _not_a_refusal(record: logging.LogRecord) -> bool:
    """py4j logs every exception of a Python callback at ERROR; a refusal is none."""
    return not (record.exc_info and isinstance(record.exc_info[1], BatchRefused))


logging.getLogger("py4j.clientserver").addFilter(_not_a_refusal)


class StopGate:
    """The ``foreachBatch`` function, refusing every batch that starts after ``stop``.

    Contract: a refused batch has touched nothing — no file, no commit, no callback —
    and, because it raised, Spark records no commit for it, so the next start replays
    it from the checkpoint's offset log.
    """

    def __init__(self, fn: Callable[[DataFrame, int], None], stop: StopRequest) -> None:
        self.fn = fn
        self.stop = stop

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if self.stop.requested:
            logger.info("batch %d not started: stopping (it is read again on the next "
                        "start)", batch_id)
            _stream_errors(quiet=True)
            raise BatchRefused(f"{REFUSED} (batch {batch_id})")
        self.fn(df, batch_id)


#: the JVM logger that prints a query's end on an error, with its stack trace
_STREAM_LOGGER = "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution"
_previous_level: list[Any] = []


#: how many queries await_query waits on (ingestion and silence run side by side):
#: the muted logger is restored when the last of them has ended
_awaiting = 0
_awaiting_lock = threading.Lock()


def _stream_errors(*, quiet: bool) -> None:
    """Silence (or restore) Spark's "terminated with error" stack trace, which a
    refused batch would print although the stop is clean."""
    from pyspark import SparkContext

    jvm = SparkContext._jvm  # noqa: SLF001 - log4j has no Python API
    if jvm is None:
        return
    log4j = jvm.org.apache.logging.log4j
    configurator = log4j.core.config.Configurator
    if quiet and not _previous_level:
        _previous_level.append(log4j.LogManager.getLogger(_STREAM_LOGGER).getLevel())
        configurator.setLevel(_STREAM_LOGGER, log4j.Level.OFF)
    elif not quiet and _previous_level:
        configurator.setLevel(_STREAM_LOGGER, _previous_level.pop())


def await_query(query: StreamingQuery, stop: StopRequest, *, poll_s: float = 0.5) -> None:
    """Block until the query ends by itself or a stop was requested and carried out.

    The query's batch function must be wrapped in a :class:`StopGate` on the same
    ``stop``: then, after a request, the query either goes idle between triggers (and
    is stopped) or ends on the refused batch (not an error). Raises the query's
    exception if it failed.
    """
    from pyspark.errors import StreamingQueryException

    global _awaiting
    with _awaiting_lock:
        _awaiting += 1
    try:
        while query.isActive:
            if stop.requested:
                while (query.isActive and query.status.get("isTriggerActive")
                       and not stop.urgent):
                    time.sleep(0.1)
                query.stop()
                break
            query.awaitTermination(poll_s)
    except StreamingQueryException:
        pass  # it ended on an error: exception() has it
    finally:
        with _awaiting_lock:
            _awaiting -= 1
            if stop.requested and _awaiting == 0:  # the last query ended (and logged)
                _stream_errors(quiet=False)
    exc = query.exception()
    if exc is not None and stop.requested and REFUSED in str(exc):
        logger.info("%s stopped after the batch in flight", query.name)
    elif exc is not None:
        raise exc
