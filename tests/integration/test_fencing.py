"""Two writers on one checkpoint (issue 40 item 1, audit-2 #1): the first freezes inside
a destructive step of a batch while the second takes the lease over and commits the
batch; then the first resumes. Nothing of the new holder's is deleted, no row is lost
or twice (read back by DuckDB and Spark), and the stale writer stops with a clear
message. The freeze is a hook in the first writer's own filesystem calls (a stall of
the process there: GC, a partition, SIGSTOP), on local disk, S3 (SeaweedFS: the lease's
steps are conditional PUTs) and HDFS (MiniDFSCluster: renames that refuse an existing
name)."""

from __future__ import annotations

import itertools
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


_n = itertools.count()


def _writer(spark, lake: str) -> Any:  # noqa: ANN001, ANN401
    writer = open_writer("parquet", spark, TableLayout.of(lake, "events"),
                         WriterOptions(app_id="app-fenced", lease_s=TTL_S))
    writer.prepare()
    return writer


class _Store:
    """Where the lake lives, and an independent reader of its Parquet files."""

    def __init__(self, request: pytest.FixtureRequest, spark, tmp_path: Path,  # noqa: ANN001
                 kind: str) -> None:
        self.kind, self.tmp = kind, tmp_path
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        if kind == "s3":
            from lakesink.config.storage import S3Storage
            from lakesink.runtime.storage import s3a_options

            self.server = request.getfixturevalue("s3_server")
            for key, value in s3a_options(S3Storage(
                    endpoint=self.server.endpoint, region="us-east-1",
                    access_key_id=self.server.access_key,
                    secret_access_key=self.server.secret_key)).items():
                conf.set(key, value)
            self.lake = f"s3a://{self.server.bucket}/fencing-{next(_n)}"
        elif kind == "hdfs":
            from tests.fixtures.services import HDFS_CLIENT_CONF

            self.server = request.getfixturevalue("hdfs")
            for key, value in HDFS_CLIENT_CONF.items():
                conf.set(key.removeprefix("spark.hadoop."), value)
            self.lake = f"{self.server.uri}/fencing-{next(_n)}"
        else:
            self.lake = str(tmp_path / "lake")

    def ids(self) -> list[int]:
        """DuckDB's count of every Parquet file in the table folder (a glob reader)."""
        if self.kind == "s3":
            con, glob = self.server.duckdb(), f"s3://{self.lake.split('://', 1)[1]}"
        elif self.kind == "hdfs":
            from tests.integration.test_hdfs import hdfs_parquet_ids

            return sorted(hdfs_parquet_ids(self.server, self.lake.split(self.server.uri)[1]
                                           + "/events", self.tmp / f"got-{next(_n)}"))
        else:
            con, glob = duckdb.connect(), self.lake
        return sorted(r[0] for r in con.sql(
            f"SELECT id FROM read_parquet('{glob}/events/**/*.parquet')").fetchall())


@pytest.mark.parametrize("store", ["local", "s3", "hdfs"])
@pytest.mark.parametrize("step", ["replace", "write_once"])
def test_a_frozen_writer_never_touches_what_the_new_holder_committed(
        request, spark, tmp_path, step, store) -> None:
    """``replace``: frozen inside its publish, after its checks (the audit's sequence
    (a): it deleted the holder's committed file before its rename). ``write_once``:
    frozen right before its manifest, after its proof."""
    where = _Store(request, spark, tmp_path, store)
    lake = where.lake
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
        committed = where.ids()
        assert committed == list(range(50))
        resume.set()
        thread.join(120)
        (error,) = outcome
        assert isinstance(error, (SecondWriterError, LeaseLost)), error
        print(f"fencing store={store} step={step}: the stale writer stopped with: {error}")
        assert where.ids() == list(range(50)), "the stale writer changed the table"
        assert spark.read.parquet(f"{lake}/events").count() == 50
        assert holder.is_committed(0)
        more = spark.range(50, 60).selectExpr("id", "cast(id % 5 as string) as location")
        assert not holder.write_batch(1, more).skipped  # the holder goes on
        assert where.ids() == list(range(60))
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


@pytest.mark.parametrize("store", ["s3", "hdfs"])
def test_a_lease_step_removed_while_it_is_read_reads_as_absent(
        request, spark, tmp_path, store) -> None:
    """A stale writer's renewal finds its next step taken and reads it, while the new
    holder prunes that step (CI, stop 61: HDFS's ``open`` failed with
    FileNotFoundException and the stale writer stopped with a raw JVM error instead of
    LeaseLost). A file removed between the existence check and the open reads as absent."""
    from lakesink.tables.fs import HadoopFS

    where = _Store(request, spark, tmp_path, store)
    fs = HadoopFS(spark, where.lake)
    gone = f"{where.lake}/.lakesink/events/writer-x/lease-000000000004.json"
    fs.exists = lambda path: True  # type: ignore[method-assign] # the check saw it
    assert fs.read_text(gone) is None
    assert fs.read_json(gone) is None
