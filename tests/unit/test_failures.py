"""One failure taxonomy (no Spark): which errors end a run (:func:`is_final`, read by the
batch retry and the query restart alike), an error as one line, and the one loop that
restarts a query (:mod:`lakesink.runtime.query_runner`) with each policy."""

from __future__ import annotations

import pytest
from pyspark.errors import StreamingQueryException

from lakesink.errors import (
    BatchRefused,
    CatalogError,
    CatalogUnavailable,
    CommitMismatch,
    ConfigError,
    LayoutError,
    LeaseLost,
    RegistryUnavailable,
    SecondWriterError,
    SinkError,
    is_final,
    one_line,
)
from lakesink.runtime.query_runner import RestartPolicy, run_with_restarts
from lakesink.runtime.shutdown import StopRequest


@pytest.mark.parametrize("exc", [ConfigError("k", "bad"), LayoutError("table", "differs"),
                                 CommitMismatch("rows"), LeaseLost("taken"),
                                 SecondWriterError("busy"), CatalogError("409"),
                                 BatchRefused("stop")])
def test_errors_no_retry_can_mend_are_final(exc: Exception) -> None:
    assert is_final(exc)
    # the same error raised inside a batch reaches the query wrapped by Spark
    wrapped = StreamingQueryException(f"[FOREACH_BATCH_USER_FUNCTION_ERROR]\nTraceback ..."
                                      f"\nlakesink.errors.{type(exc).__name__}: {exc}")
    assert is_final(wrapped)


@pytest.mark.parametrize("exc", [SinkError("s3 throttled"), RegistryUnavailable("down"),
                                 CatalogUnavailable("refused connection"), OSError("reset")])
def test_transient_errors_are_retried_by_both_loops(exc: Exception) -> None:
    """The two loops disagreed before: ``CatalogUnavailable`` (retriable) counted as final
    for the query restart, which matched ``CatalogError`` by class."""
    assert not is_final(exc)
    assert not is_final(StreamingQueryException(f"lakesink.errors.{type(exc).__name__}: x"))


def test_one_line_is_the_first_line_and_for_a_python_traceback_its_raised_error() -> None:
    assert one_line(ValueError("\n  first\nsecond")) == "ValueError: first"
    assert one_line(ValueError("x" * 400), 10, name=False) == "x" * 10
    assert one_line(ValueError("")) == "ValueError('')"
    spark = StreamingQueryException("[PYTHON_DATA_SOURCE_ERROR] failed: Traceback (most recent "
                                    "call last):\n  File x\nredis.ConnectionError: refused")
    assert one_line(spark, name=False) == ("[PYTHON_DATA_SOURCE_ERROR] failed: "
                                           "redis.ConnectionError: refused")


class Query:
    """A query that ends at once, on ``error`` or cleanly (as await_query sees it)."""

    def __init__(self, error: str | None) -> None:
        self.error = StreamingQueryException(error) if error else None
        self.isActive, self.status = False, {"isTriggerActive": False}

    def exception(self) -> StreamingQueryException | None:
        return self.error

    def stop(self) -> None:
        self.isActive = False


def run(errors: list[str | None], policy: RestartPolicy, *, progress: list[int] | None = None,
        stop: StopRequest | None = None) -> tuple[int, list[int], int]:
    started, failures, restarts = [0], [], [0]
    stop = stop or StopRequest()

    def start() -> Query:
        started[0] += 1
        if not errors:
            stop.event.set()  # nothing left to run: the operator stops
            return Query(None)
        return Query(errors.pop(0))

    def restart() -> None:
        restarts[0] += 1

    run_with_restarts(start, stop, policy,
                      progress=(lambda: progress.pop(0)) if progress else (lambda: 0),
                      on_failure=failures.append, on_restart=restart)
    return started[0], failures, restarts[0]


def test_ingestion_restarts_until_its_limit_without_progress_then_raises() -> None:
    policy = RestartPolicy(0.0, 0.0, restarts=2)
    with pytest.raises(StreamingQueryException, match="disk full"):
        run(["disk full"] * 5, policy)
    assert run(["disk full", "disk full", None], policy) == (3, [1, 2], 2)


def test_progress_between_failures_starts_the_count_afresh() -> None:
    # batches done before/after each attempt: progress after the first and second start
    started, failures, _ = run(["a", "b", "c", None], RestartPolicy(0.0, 0.0, restarts=1),
                               progress=[0, 1, 1, 2, 2, 3, 3, 3])
    assert (started, failures) == (4, [1, 1, 1])


def test_a_final_error_ends_the_run_at_once() -> None:
    with pytest.raises(StreamingQueryException, match="CommitMismatch"):
        run(["lakesink.errors.CommitMismatch: 10 rows written, 9 staged", None],
            RestartPolicy(0.0, 0.0, restarts=5))


def test_silence_never_ends_the_run_and_restarts_even_a_final_error() -> None:
    policy = RestartPolicy(0.0, 0.0, restarts=None, ends_run=False, name="silence query")
    started, failures, restarts = run(
        ["lakesink.errors.ConfigError: x", "boom", "boom", "boom"], policy)
    assert started == 5 and failures == [] and restarts == 0  # logged, not counted
    stopped = StopRequest()
    stopped.event.set()
    assert run(["never started"], policy, stop=stopped)[0] == 0
