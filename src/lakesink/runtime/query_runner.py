"""One loop runs a streaming query and restarts it from its checkpoint after a failure.

The ingestion query and the silence query both run here; what differs is a value, the
:class:`RestartPolicy`. Which failures end the run is one rule, :func:`lakesink.errors.
is_final` (the batch retry reads it too). A restart replays nothing twice: every batch
is idempotent per batch id (:mod:`lakesink.tables.base`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakesink.errors import is_final, one_line
from lakesink.runtime.shutdown import StopRequest, await_query

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    """How a query is restarted after it failed: after ``initial_backoff_s``, doubling up
    to ``max_backoff_s``."""

    initial_backoff_s: float
    max_backoff_s: float
    #: failures in a row without progress after which the last one is raised (a final
    #: error, or one during a stop, is raised at once); None: never give up — the query
    #: must not end the run (silence detection), every failure is logged and restarted
    restarts: int | None
    #: the query ending by itself ends the run (else it starts again until stopped)
    ends_run: bool = True
    name: str = "query"


def run_with_restarts(start: Callable[[], StreamingQuery], stop: StopRequest,
                      policy: RestartPolicy, *, progress: Callable[[], int] = lambda: 0,
                      on_failure: Callable[[int], None] | None = None,
                      on_restart: Callable[[], None] | None = None,
                      after: Callable[[], None] | None = None) -> None:
    """Start the query ``start()`` makes and wait for it (or ``stop``); restart it after
    a failure as ``policy`` says. ``progress()`` counts finished batches: a failure after
    progress starts the count of failures in a row afresh. ``on_failure(failures)`` is
    told each failure, ``on_restart()`` each restart, ``after()`` runs after each attempt
    (the query stopped)."""
    delay, failures = policy.initial_backoff_s, 0
    while not (policy.restarts is None and stop.requested):
        done_before = progress()
        query = None
        try:
            query = start()
            await_query(query, stop)
            if policy.ends_run or stop.requested:
                return
        except Exception as exc:
            if policy.restarts is None:  # never ends the run: logged, restarted
                logger.error("%s failed (%s); restarting from its checkpoint in %.0fs",
                             policy.name, one_line(exc, name=False), delay)
            else:
                if stop.requested or is_final(exc):
                    raise
                if progress() > done_before:  # progress: start counting afresh
                    delay, failures = policy.initial_backoff_s, 0
                failures += 1
                if on_failure is not None:
                    on_failure(failures)
                if failures > policy.restarts:
                    raise
                if on_restart is not None:
                    on_restart()
                logger.warning("%s failed (%s); restarting from the checkpoint in %.0fs "
                               "(%d of %d)", policy.name, one_line(exc), delay, failures,
                               policy.restarts)
            if stop.event.wait(delay):
                return
            delay = min(delay * 2, policy.max_backoff_s)
        finally:
            if query is not None and query.isActive:
                query.stop()
            if after is not None:
                after()
