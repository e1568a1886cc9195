"""Retries of a whole batch, with exponential backoff, for transient failures (an S3
server throttling or down for a while, a reset connection, a broker restart).

Retrying a batch is safe because the batch function is idempotent per batch id (the
table writers' contract, :mod:`lakesink.tables.base`): a retry skips what the failed
attempt committed and cleans what it left unfinished. Errors that are not
``retriable`` (configuration; a commit that would not match its batch) are not retried.
When the attempts run out the error propagates, the query stops, and the batch is
replayed on the next start — still exactly once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lakesink.errors import BatchRefused, is_final, one_line
from lakesink.observe.metrics import METRICS
from lakesink.runtime.shutdown import REFUSED

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)


class RetryingBatch:
    """``fn(df, batch_id)`` tried up to ``attempts`` times; ``stats`` passes through."""

    def __init__(self, fn: Callable[[DataFrame, int], None], *, attempts: int,
                 initial_backoff_s: float, max_backoff_s: float,
                 sleep: Callable[[float], None] = time.sleep,
                 stop: threading.Event | None = None) -> None:
        """``stop``: a stop request ends a backoff at once; the batch is then refused
        (:class:`~lakesink.runtime.shutdown.BatchRefused`: nothing of it is committed,
        the next start replays it), so a failing batch does not hold a stop up."""
        self.fn = fn
        self.stop = stop
        self.attempts = attempts
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.sleep = sleep
        self.retries = 0

    @property
    def stats(self) -> Any:  # noqa: ANN401 - the wrapped function's RunStats
        return self.fn.stats  # type: ignore[attr-defined]

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        delay = self.initial_backoff_s
        for attempt in range(1, self.attempts + 1):
            try:
                self.fn(df, batch_id)
                return
            except Exception as exc:
                if is_final(exc):
                    raise
                if attempt == self.attempts:
                    logger.error("batch %d failed %d time(s), giving up: %s", batch_id,
                                 attempt, one_line(exc))
                    raise
                self.retries += 1
                METRICS.batch_retries.inc()
                logger.warning("batch %d failed (attempt %d of %d): %s; retrying in %.0fs",
                               batch_id, attempt, self.attempts, one_line(exc), delay)
                if self.stop is not None:
                    if self.stop.wait(delay):
                        raise BatchRefused(f"{REFUSED} (batch {batch_id}, while it was "
                                           "waiting to be tried again)") from exc
                else:
                    self.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)

