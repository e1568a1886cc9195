"""Two writers on one checkpoint (issue 40 item 1, audit-2 #1): the first freezes inside
a destructive step of a batch while the second takes the lease over and commits the
batch; then the first resumes. Nothing of the new holder's is deleted, no row is lost
or twice (read back by DuckDB and Spark), and the stale writer stops with a clear
message. The freeze is a hook in the first writer's own filesystem calls (a stall of
the process there: GC, a partition, SIGSTOP), on local disk."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import duckdb
import pytest

from lakesink.errors import LeaseLost, SecondWriterError
from lakesink.tables import lease as lease_module
from lakesink.tables.formats import WriterOptions, open_writer
from lakesink.tables.layout import TableLayout

pytestmark = [pytest.mark.integration, pytest.mark.spark]

TTL_S = 2.0


def _writer(spark, lake: Path) -> Any:  # noqa: ANN001, ANN401
    writer = open_writer("parquet", spark, TableLayout.of(str(lake), "events"),
                         WriterOptions(app_id="app-fenced", lease_s=TTL_S))
    writer.prepare()
    return writer


def _ids(lake: Path) -> list[int]:
    return sorted(r[0] for r in duckdb.sql(
        f"SELECT id FROM read_parquet('{lake}/events/**/*.parquet')").fetchall())


@pytest.mark.parametrize("step", ["replace", "write_once"])
def test_a_frozen_writer_never_touches_what_the_new_holder_committed(spark, tmp_path,
                                                                      step) -> None:
    """``replace``: frozen inside its publish, after its checks (the audit's sequence
    (a): it deleted the holder's committed file before its rename). ``write_once``:
    frozen right before its manifest, after its proof."""
    lake = tmp_path / "lake"
    rows = spark.range(0, 50).selectExpr("id", "cast(id % 5 as string) as location")
    stale = _writer(spark, lake)
    frozen, resume = threading.Event(), threading.Event()
    real = getattr(stale.fs, step)

    def stall(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        target = args[0] if step == "write_once" else args[1]
        if ("/manifests/" not in target if step == "write_once"
                else "/.lakesink/" in target):
            return real(*args, **kwargs)  # bookkeeping before the step frozen in
        if not frozen.is_set():
            stale.lease._stop.set()  # a frozen process renews nothing
            frozen.set()
            assert resume.wait(120)
        return real(*args, **kwargs)

    setattr(stale.fs, step, stall)
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            stale.write_batch(0, rows)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    assert frozen.wait(120)
    # the holder is another process: it does not see this process's registry of held
    # leases (it takes the stale step over by the host-and-pid rule or after the TTL)
    lease_module._HELD.pop(stale.lease.folder, None)
    holder = _writer(spark, lake)  # waits out the TTL, then takes the lease
    try:
        done = holder.write_batch(0, rows)  # the batch again, from its start
        assert done.files >= 1 and not done.skipped
        committed = _ids(lake)
        assert committed == list(range(50))
        resume.set()
        thread.join(120)
        (error,) = outcome
        assert isinstance(error, (SecondWriterError, LeaseLost)), error
        print(f"fencing step={step}: the stale writer stopped with: {error}")
        assert _ids(lake) == list(range(50)), "the stale writer changed the table"
        assert spark.read.parquet(str(lake / "events")).count() == 50
        assert holder.is_committed(0)
        more = spark.range(50, 60).selectExpr("id", "cast(id % 5 as string) as location")
        assert not holder.write_batch(1, more).skipped  # the holder goes on
        assert _ids(lake) == list(range(60))
    finally:
        resume.set()
        holder.close()
        stale.close()


def test_a_stale_spark_delta_writer_stops_instead_of_waiting_forever(spark, tmp_path) -> None:
    """audit-2 #22: a Spark-path Delta writer frozen right after its fence while another
    takes the table over and commits the batch: Delta skips the stale append by its txn,
    without a job, and the batch's count (a wait on that job) never came. Now the stale
    writer sees the commit is not its own, proves its lease at the store and stops."""
    layout = TableLayout.of(str(tmp_path / "lake"), "events")
    rows = spark.range(0, 20).selectExpr("id", "cast(id % 2 as string) as location")
    holders: list[Any] = []

    def delta_writer() -> Any:  # noqa: ANN401
        writer = open_writer("delta", spark, layout, WriterOptions(
            app_id="app-delta", partition_by=("location",), lease_s=TTL_S))
        writer.prepare()
        return writer

    stale = delta_writer()
    stale.write_batch(0, rows)
    passed = stale.fence

    def fenced_then_frozen() -> None:
        passed()  # it still holds the table here
        stale.lease._stop.set()  # frozen: renews nothing
        lease_module._HELD.pop(stale.lease.folder, None)  # the holder: another process
        holder = delta_writer()  # waits out the TTL, then takes the lease
        holders.append(holder)
        holder._committed_known = False
        assert not holder.write_batch(1, rows).skipped  # the holder commits batch 1

    stale.fence = fenced_then_frozen  # type: ignore[method-assign]

    def never() -> dict[str, int]:
        raise AssertionError("waited for the count of a job that never runs")

    try:
        with pytest.raises(LeaseLost):
            stale.write_batch(1, rows, commit_info=never)
        ids = sorted(r.id for r in spark.read.format("delta").load(layout.table).collect())
        assert ids == sorted(list(range(20)) * 2)  # batches 0 and 1, each once
    finally:
        for writer in (*holders, stale):
            writer.close()
