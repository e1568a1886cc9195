"""The rejected area: records that could not be decoded, with raw bytes and the reason.

Until the dead-letter table exists, rejected records of batch *b* are written to
``<base>/_rejected/<table>/part-<b>-<run>.parquet`` — beside the table, never inside
it, so table readers never see them. The name is derived from the batch, so a replayed
batch overwrites its own file instead of adding a second one.

Columns: ``key`` and ``value`` (raw bytes), ``reason`` (a code), ``detail`` (text),
``stage`` (``decode``: unreadable; ``schema``: read but does not fit the table), ``topic``, ``partition``, ``offset``, ``kafka_timestamp``, ``batch_id``, ``app_id``,
``rejected_at``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from lakesink.errors import SinkError
from lakesink.tables.fs import HadoopFS
from lakesink.tables.identity import run_tag
from lakesink.tables.layout import TableLayout

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)


class RejectedWriter:
    def __init__(self, fs: HadoopFS, layout: TableLayout, *, app_id: str) -> None:
        self.fs = fs
        self.layout = layout
        self.run = run_tag(app_id)

    def path(self, batch_id: int) -> str:
        return self.layout.rejected_file(self.run, batch_id)

    def write(self, batch_id: int, df: DataFrame, *, only_if_any: bool = False) -> int:
        """Write the batch's rejected rows as one file (idempotent per batch id).

        With ``only_if_any`` the rows are counted first and nothing is written for none
        (used on replays, where no count is known). Returns the rows written, or -1
        when they were not counted.
        """
        if only_if_any:
            df = df.cache()
            count = df.count()
            if count == 0:
                df.unpersist()
                return 0
        else:
            count = -1
        staging = self.layout.rejected_staging(self.run, batch_id)
        self.fs.delete(staging)
        df.coalesce(1).write.mode("overwrite").parquet(staging)
        if only_if_any:
            df.unpersist()
        files = self.fs.list_files(staging, suffix=".parquet")
        if len(files) != 1:
            raise SinkError(f"expected one rejected file in {staging}, found {len(files)}")
        self.fs.replace(files[0].path, self.path(batch_id))
        self.fs.delete(staging)
        return count
