"""Batch retries: backoff, give-up, and no retry for configuration errors (no Spark)."""

from __future__ import annotations

import pytest

from lakesink.errors import ConfigError
from lakesink.pipeline.retry import RetryingBatch


class Flaky:
    def __init__(self, failures: int, exc: Exception | None = None) -> None:
        self.failures = failures
        self.calls: list[int] = []
        self.exc = exc or OSError("connection refused\n\tat some.java.Frame")
        self.stats = "the stats"

    def __call__(self, df: object, batch_id: int) -> None:
        self.calls.append(batch_id)
        if len(self.calls) <= self.failures:
            raise self.exc


def _retrying(fn: Flaky, attempts: int = 4) -> tuple[RetryingBatch, list[float]]:
    waits: list[float] = []
    return RetryingBatch(fn, attempts=attempts, initial_backoff_s=2, max_backoff_s=5,
                         sleep=waits.append), waits


def test_retries_with_backoff_then_succeeds() -> None:
    fn = Flaky(failures=3)
    batch, waits = _retrying(fn)
    batch(None, 7)  # type: ignore[arg-type]
    assert fn.calls == [7, 7, 7, 7]
    assert waits == [2, 4, 5]  # doubled, capped
    assert batch.retries == 3 and batch.stats == "the stats"


def test_gives_up_after_the_last_attempt() -> None:
    fn = Flaky(failures=10)
    batch, waits = _retrying(fn, attempts=3)
    with pytest.raises(OSError, match="connection refused"):
        batch(None, 1)  # type: ignore[arg-type]
    assert len(fn.calls) == 3 and len(waits) == 2


def test_configuration_errors_are_not_retried() -> None:
    fn = Flaky(failures=1, exc=ConfigError("table.partition_by", "bad"))
    batch, waits = _retrying(fn)
    with pytest.raises(ConfigError):
        batch(None, 1)  # type: ignore[arg-type]
    assert fn.calls == [1] and waits == []


def test_a_stop_request_ends_the_backoff_and_refuses_the_batch() -> None:
    import threading
    import time

    from lakesink.errors import BatchRefused
    from lakesink.runtime.shutdown import REFUSED

    stop = threading.Event()
    fn = Flaky(failures=10)
    batch = RetryingBatch(fn, attempts=5, initial_backoff_s=60, max_backoff_s=60, stop=stop)
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(BatchRefused, match=REFUSED):
        batch(None, 3)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5  # not the 60 s backoff
    assert fn.calls == [3]  # not tried again after the stop
