"""The graceful stop's rules without Spark: the gate refuses batches after a request,
a refusal ends the wait without an error, any other failure is raised."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from lakesink.errors import BatchRefused
from lakesink.runtime import shutdown
from lakesink.runtime.shutdown import REFUSED, StopGate, StopRequest, await_query


def test_gate_passes_batches_until_a_stop_then_refuses_them() -> None:
    seen: list[int] = []
    stop = StopRequest()
    gate = StopGate(lambda _df, batch_id: seen.append(batch_id), stop)
    gate(None, 0)
    gate(None, 1)
    stop.event.set()
    with pytest.raises(BatchRefused, match=REFUSED):
        gate(None, 2)
    assert seen == [0, 1]  # the refused batch never reached the writer


class EndsOnError:
    """A query that fails with ``error`` while the driver waits on it (the Spark query's
    interface as await_query uses it)."""

    def __init__(self, error: str) -> None:
        self.name = "lakesink_events"
        self.error = StreamingQueryException(error)
        self.isActive = True
        self.stopped = False
        self.status = {"isTriggerActive": False}

    def awaitTermination(self, _timeout: float) -> None:  # noqa: N802 - Spark's name
        self.isActive = False
        raise self.error

    def exception(self) -> Any:  # noqa: ANN401
        return self.error

    def stop(self) -> None:
        self.stopped = True
        self.isActive = False


def test_a_refused_batch_after_a_stop_ends_the_wait_cleanly() -> None:
    stop = StopRequest()
    stop.event.set()
    query = EndsOnError(f"[FOREACH_BATCH_USER_FUNCTION_ERROR] ... {REFUSED} (batch 7)")
    query.isActive = False  # it ended on the refusal before the driver looked
    await_query(query, stop)  # no error


@pytest.mark.parametrize("requested", [False, True])
def test_other_failures_are_raised(requested: bool) -> None:
    stop = StopRequest()
    query = EndsOnError("disk full")
    if requested:
        stop.event.set()
        query.status = {"isTriggerActive": True}
        query.isActive = False
    with pytest.raises(StreamingQueryException, match="disk full"):
        await_query(query, stop)


def test_a_refusal_without_a_stop_request_is_raised() -> None:
    with pytest.raises(StreamingQueryException):
        await_query(EndsOnError(REFUSED), StopRequest())


def test_py4j_does_not_log_a_refusal_but_logs_other_callback_errors(caplog) -> None:  # noqa: ANN001
    log = logging.getLogger("py4j.clientserver")
    with caplog.at_level(logging.ERROR, logger="py4j.clientserver"):
        for exc in (BatchRefused(REFUSED), ValueError("boom")):
            try:
                raise exc
            except Exception:
                log.exception("There was an exception while executing the Python Proxy")
    assert [type(r.exc_info[1]) for r in caplog.records] == [ValueError]


class EndsWhenReleased(EndsOnError):
    """A query refused at the stop, that ends only when ``release`` is set."""

    def __init__(self) -> None:
        super().__init__(REFUSED)
        self.release = threading.Event()

    def awaitTermination(self, timeout: float) -> None:  # noqa: N802
        if self.release.wait(timeout):
            super().awaitTermination(timeout)

    def stop(self) -> None:
        self.release.wait()
        self.isActive = False


def test_the_muted_spark_log_comes_back_when_the_last_query_has_ended(monkeypatch) -> None:  # noqa: ANN001
    calls: list[bool] = []
    monkeypatch.setattr(shutdown, "_stream_errors", lambda *, quiet: calls.append(quiet))
    stop = StopRequest()
    stop.event.set()
    silence = EndsWhenReleased()  # still ending, maybe with its own log line to come
    beside = threading.Thread(target=await_query, args=(silence, stop), daemon=True)
    beside.start()
    deadline = time.monotonic() + 10
    while shutdown._awaiting < 1 and time.monotonic() < deadline:  # noqa: SLF001
        time.sleep(0.01)
    ingestion = EndsOnError(REFUSED)
    ingestion.isActive = False
    await_query(ingestion, stop)
    assert calls == []  # not while the silence query may still log its refusal
    silence.release.set()
    beside.join(5)
    assert calls == [False]
