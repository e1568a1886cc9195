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

Columns: ``key`` and ``value`` (raw bytes), ``reason`` (the error class, a code),
``detail`` (the error message), ``stage`` (``decode``: unreadable; ``route``: no route
takes it; ``transform``: a transform raised; ``schema``: read but does not fit the
table), ``topic``, ``partition``, ``offset``, ``kafka_timestamp``, ``batch_id``,
``app_id``, ``rejected_at`` (the ingest time).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from lakesink.errors import SinkError
from lakesink.tables.fs import HadoopFS
from lakesink.tables.identity import run_tag
from lakesink.tables.layout import TableLayout

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakesink.tables.delta import DeltaTableWriter

logger = logging.getLogger(__name__)


def dead_letter_layout(layout: TableLayout) -> TableLayout:
    """The dead-letter table of ``layout`` as a table of its own (Delta format)."""
    return TableLayout(layout.base, f"_rejected/{layout.name}")


class RejectedWriter:
    def __init__(self, fs: HadoopFS, layout: TableLayout, *, app_id: str,
                 fmt: str = "parquet", spark: SparkSession | None = None) -> None:
        self.fs = fs
        self.layout = layout
        self.run = run_tag(app_id)
        self.format = fmt
        self.delta: DeltaTableWriter | None = None
        if fmt == "delta":
            from lakesink.tables.delta import DeltaTableWriter

            assert spark is not None
            self.delta = DeltaTableWriter(spark, dead_letter_layout(layout), app_id=app_id,
                                          partition_by=[], files_per_partition=0)
            self.delta.prepare()

    def path(self, batch_id: int) -> str:
        if self.delta is not None:
            return self.delta.layout.table
        return self.layout.rejected_file(self.run, batch_id)

    def write(self, batch_id: int, df: DataFrame, *, only_if_any: bool = False) -> int:
        """Write the batch's rejected rows once per batch id.

        With ``only_if_any`` the rows are counted first and nothing is written for none
        (used on replays, where no count is known). Returns the rows written (0 when a
        Delta dead-letter table already holds the batch), or -1 when not counted.
        """
        if self.delta is not None and self.delta.is_committed(batch_id):
            return 0
        if only_if_any:
            df = df.cache()
            count = df.count()
            if count == 0:
                df.unpersist()
                return 0
        else:
            count = -1
        try:
            if self.delta is not None:
                self.delta.write_batch(batch_id, df.coalesce(1))
            else:
                self._write_file(batch_id, df)
        finally:
            if only_if_any:
                df.unpersist()
        return count

    def _write_file(self, batch_id: int, df: DataFrame) -> None:
        staging = self.layout.rejected_staging(self.run, batch_id)
        self.fs.delete(staging)
        df.coalesce(1).write.mode("overwrite").parquet(staging)
        files = self.fs.list_files(staging, suffix=".parquet")
        if len(files) != 1:
            raise SinkError(f"expected one rejected file in {staging}, found {len(files)}")
        self.fs.replace(files[0].path, self.path(batch_id))
        self.fs.delete(staging)
