"""The dead-letter table of a table: records that could not be decoded, transformed,
routed or made to fit, with their raw bytes and the reason.

It lives beside the table, never inside it (so table readers never see it), at
``<base>/_rejected/<table>/``, in one of two formats (``dlq.format``):

* ``parquet`` (default): one file per batch, ``part-<batch>-<run>.parquet``. The name
  is derived from the batch, so a replayed batch overwrites its own file instead of
  adding a second one.
* ``delta``: a Delta table written by :class:`~lakesink.tables.delta.DeltaTableWriter`,
  keyed exactly like the data table (``txnAppId`` = the app id, ``txnVersion`` = the
  batch id), so a replayed batch's dead letters are committed once.

Columns (:data:`DEAD_LETTER_COLUMNS`, built by :func:`dead_letter_rows`): ``key`` and
``value`` (raw bytes), ``reason`` (the error class, a code), ``detail`` (the error
message), ``stage`` (``decode``: unreadable; ``route``: no route takes it;
``transform``: a transform raised; ``schema``: read but does not fit the table),
``topic``, ``partition``, ``offset``, ``kafka_timestamp``, ``batch_id``, ``app_id``,
``rejected_at`` (the ingest time).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lakesink.errors import CommitMismatch, SinkError
from lakesink.tables.fs import HadoopFS
from lakesink.tables.identity import run_tag
from lakesink.tables.layout import TableLayout
from lakesink.tables.formats import WriterOptions, open_writer, table_format

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


logger = logging.getLogger(__name__)

#: the dead-letter table's columns, in order
DEAD_LETTER_COLUMNS = ("key", "value", "reason", "detail", "stage", "topic", "partition",
                       "offset", "kafka_timestamp", "batch_id", "app_id", "rejected_at")


def dead_letter_rows(records: DataFrame, *, reason: Column, detail: Column, stage: Column,
                     kafka_timestamp: Column, batch_id: int, app_id: str) -> DataFrame:
    """``records`` (raw records: key, value, topic, partition, offset) as dead-letter
    rows of batch ``batch_id`` of ``app_id``, rejected now — the one place the row is
    built (the mark stage's dead letters, the unrouted records)."""
    import datetime as dt

    from pyspark.sql import functions as F

    return records.select(
        "key", "value", reason.alias("reason"), detail.alias("detail"), stage.alias("stage"),
        "topic", "partition", "offset", kafka_timestamp.alias("kafka_timestamp"),
        F.lit(batch_id).cast("long").alias("batch_id"), F.lit(app_id).alias("app_id"),
        F.lit(dt.datetime.now(dt.UTC).replace(tzinfo=None)).cast("timestamp")
        .alias("rejected_at"))


def dead_letter_layout(layout: TableLayout) -> TableLayout:
    """The dead-letter table of ``layout`` as a table of its own (Delta format)."""
    return TableLayout(layout.base, f"_rejected/{layout.name}")


class RejectedWriter:
    """A table's dead letters, staged before the table's commit and published after it.

    Contract (what makes the dead letters of a committed batch exactly those of its
    first run, whatever the configuration of a later replay says):

    * :meth:`stage` writes the batch's rejected rows to the outbox
      (``.lakesink/<table>/staging/<run>/rejected-<batch>/``) *before* the table's
      commit point; an attempt at an uncommitted batch first :meth:`discard` s an
      earlier attempt's outbox, so the outbox always matches the attempt that commits;
    * :meth:`publish` moves the outbox into the dead-letter table *after* the commit,
      keyed by the batch (Parquet: a rename to the batch's file name; Delta: an append
      with ``txnAppId``/``txnVersion``), so publishing twice is publishing once;
    * a replay of a committed batch only publishes what is still in the outbox: its
      dead letters are never computed again.
    """

    def __init__(self, fs: HadoopFS, layout: TableLayout, *, app_id: str,
                 fmt: str = "parquet", spark: SparkSession | None = None,
                 lease: dict[str, Any] | None = None) -> None:
        """``lease``: the lease keywords of a Delta dead-letter table's writer (like its
        data table's); a Parquet one is covered by the data table's lease."""
        self.fs = fs
        self.layout = layout
        self.run = run_tag(app_id)
        self.format = fmt
        self.spark = spark
        self.delta: Any = None  # the dead-letter table's writer (a format with a log)
        #: proves the data table's lease at the store before the outbox is touched (the
        #: batch function sets it to its table writer's ``prove``)
        self.guard: Callable[[], None] = lambda: None
        if table_format(fmt, key="dlq.format").has_log:
            assert spark is not None
            self.delta = open_writer(fmt, spark, dead_letter_layout(layout), WriterOptions(
                app_id=app_id, files_per_partition=0, config_key="dlq.format",
                **(lease or {})))
            self.delta.prepare()

    def close(self) -> None:
        """Release the Delta dead-letter table's writer lease, if it holds one."""
        if self.delta is not None:
            self.delta.close()

    def path(self, batch_id: int) -> str:
        if self.delta is not None:
            return self.delta.layout.table
        return self.layout.rejected_file(self.run, batch_id)

    def _outbox(self, batch_id: int) -> str:
        return self.layout.rejected_staging(self.run, batch_id)

    def discard(self, batch_id: int) -> None:
        """Drop an earlier attempt's outbox (the batch is not committed)."""
        self.guard()
        self.fs.delete(self._outbox(batch_id))

    def stage(self, batch_id: int, df: DataFrame, *, expected: int | None = None,
              recount: Callable[[], int] | None = None, only_if_any: bool = False) -> int:
        """Write the batch's rejected rows to the outbox; returns their number. With
        ``expected``, a different number of staged rows raises :class:`CommitMismatch`
        (before the table's commit) unless ``recount`` (an exact count) agrees with the
        staged rows; with ``only_if_any`` nothing is staged for none."""
        outbox = self._outbox(batch_id)
        self.guard()
        self.fs.delete(outbox)
        if only_if_any:
            df = df.cache()
            try:
                if df.isEmpty():
                    return 0
                return self.stage(batch_id, df, expected=expected, recount=recount)
            finally:
                df.unpersist()
        df.coalesce(1).write.mode("overwrite").parquet(outbox)
        files = self.fs.list_files(outbox, suffix=".parquet")
        if len(files) != 1:
            raise SinkError(f"expected one rejected file in {outbox}, found {len(files)}")
        rows = self.fs.parquet_rows(files[0].path)
        if expected is not None and rows != expected and recount is not None:
            expected = recount()
        if expected is not None and rows != expected:
            raise CommitMismatch(
                f"batch {batch_id} of {self.layout.table}: {expected} record(s) counted as "
                f"rejected but {rows} staged as dead letters; nothing was committed. This "
                "is a lakesink bug: please report it with this message")
        return rows

    def reasons(self, batch_id: int) -> dict[str, int]:
        """The staged dead letters of ``batch_id`` counted by reason (before publish)."""
        files = self.fs.list_files(self._outbox(batch_id), suffix=".parquet")
        if not files or self.spark is None:
            return {}
        rows = self.spark.read.parquet(files[0].path).groupBy("reason").count().collect()
        return {str(r["reason"]): int(r["count"]) for r in rows}

    def publish(self, batch_id: int) -> int:
        """Move the batch's outbox (if any) into the dead-letter table; returns the rows
        moved (0: nothing staged, or published before)."""
        outbox = self._outbox(batch_id)
        files = self.fs.list_files(outbox, suffix=".parquet")
        if not files:
            self.fs.delete(outbox)
            return 0
        rows = self.fs.parquet_rows(files[0].path)
        if self.delta is not None:
            assert self.spark is not None
            if not self.delta.is_committed(batch_id):
                self.delta.write_batch(batch_id, self.spark.read.parquet(files[0].path))
        else:
            self.fs.replace(files[0].path, self.path(batch_id))
        self.fs.delete(outbox)
        return rows
