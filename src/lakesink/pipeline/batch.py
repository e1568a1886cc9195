"""The ``foreachBatch`` function: one micro-batch from raw records to a committed table.

Per batch: decode every record with Spark functions, split good from rejected rows
with one marker column, write the good rows through the table writer, then the
rejected ones to the rejected area. Row counts come from a Spark ``Observation`` on the
same pass (no extra scan); the rejected rows are only computed when the count says
there are any — or when the table reports the batch as already committed, since the
crash that caused the replay may have come before the rejected rows were written.

Exactly-once is the table writer's contract (:mod:`lakesink.tables.base`); this
function is deterministic for a given batch, which is what that contract needs.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Observation
from pyspark.sql import functions as F

from lakesink.decode.json import JsonDecoder
from lakesink.pipeline.columns import PartitionSpec
from lakesink.tables.base import TableWriter
from lakesink.tables.rejected import RejectedWriter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

INVALID_TIMESTAMP = "invalid_timestamp"


@dataclass
class RunStats:
    """Totals of one ``lakesink run`` (this process only)."""

    batches: int = 0
    skipped: int = 0
    records: int = 0
    written: int = 0
    rejected: int = 0
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class BatchProcessor:
    def __init__(
        self,
        *,
        decoder: JsonDecoder,
        partitions: PartitionSpec,
        writer: TableWriter,
        rejected: RejectedWriter,
        app_id: str,
    ) -> None:
        self.decoder = decoder
        self.partitions = partitions
        self.writer = writer
        self.rejected = rejected
        self.app_id = app_id
        self.stats = RunStats()

    def _marked(self, df: DataFrame) -> DataFrame:
        """Raw columns, the parsed record ``_r``, its UTC timestamp ``_ts`` (when a
        timestamp column is configured) and the rejection marker ``_fail``."""
        base = df.select(
            "key", "value", "topic", "partition", "offset",
            F.col("timestamp").alias("kafka_timestamp"),
            self.decoder.parse(F.col("value")).alias("_r"),
        )
        fail = self.decoder.failure(F.col("value"), F.col("_r"))
        if self.partitions.timestamp_column is not None:
            ts, invalid = self.partitions.timestamp(F.col("_r"), F.col("kafka_timestamp"))
            base = base.withColumn("_ts", ts)
            fail = F.coalesce(fail, F.when(invalid, F.lit(INVALID_TIMESTAMP)))
        return base.withColumn("_fail", fail)

    def rejected_rows(self, marked: DataFrame, batch_id: int) -> DataFrame:
        bad = marked.where(F.col("_fail").isNotNull())
        reason, detail = self.decoder.explain(F.col("value"), F.col("_r"))
        ts_col = self.partitions.timestamp_column
        is_ts = F.col("_fail") == F.lit(INVALID_TIMESTAMP)
        ts_detail = F.concat(
            F.lit(f"{ts_col}: cannot read "),
            F.coalesce(F.col("_r")[ts_col].cast("string"), F.lit("?")) if ts_col else F.lit("?"),
            F.lit(" as a timestamp (epoch s/ms/us/ns or ISO-8601)"),
        )
        return bad.select(
            "key", "value",
            F.when(is_ts, F.lit(INVALID_TIMESTAMP)).otherwise(reason).alias("reason"),
            F.when(is_ts, ts_detail).otherwise(detail).alias("detail"),
            "topic", "partition", "offset", "kafka_timestamp",
            F.lit(batch_id).cast("long").alias("batch_id"),
            F.lit(self.app_id).alias("app_id"),
            F.lit(dt.datetime.now(dt.UTC).replace(tzinfo=None)).cast("timestamp")
            .alias("rejected_at"),
        )

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        marked = self._marked(df)
        observation = Observation(f"lakesink_batch_{batch_id}_{time.monotonic_ns()}")
        observed = marked.observe(
            observation,
            F.count(F.lit(1)).alias("records"),
            F.count(F.col("_fail")).alias("rejected"),
        )
        ts = F.col("_ts") if "_ts" in marked.columns else None
        good = observed.where(F.col("_fail").isNull()).select(
            *self.partitions.output_columns(F.col("_r"), self.decoder.schema, ts)
        )

        def counts() -> dict[str, Any]:
            metrics = observation.get
            records, rejected = int(metrics["records"]), int(metrics["rejected"])
            return {"records": records, "written": records - rejected, "rejected": rejected}

        result = self.writer.write_batch(batch_id, good, commit_info=counts)
        rejected_rows = self.rejected_rows(marked, batch_id)
        if result.skipped:
            rewritten = self.rejected.write(batch_id, rejected_rows, only_if_any=True)
            if rewritten:
                logger.warning("batch %d (replayed): %d rejected record(s) rewritten", batch_id,
                               rewritten)
        elif result.info["rejected"]:
            self.rejected.write(batch_id, rejected_rows)
            logger.warning("batch %d: %d record(s) rejected -> %s", batch_id,
                           result.info["rejected"], self.rejected.path(batch_id))
        elapsed = time.monotonic() - started
        # Spark runs one batch at a time; the driver reads the totals after the query.
        stats = self.stats
        stats.batches += 1
        stats.seconds += elapsed
        if result.skipped:
            stats.skipped += 1
        else:
            stats.records += int(result.info.get("records", 0))
            stats.written += int(result.info.get("written", 0))
            stats.rejected += int(result.info.get("rejected", 0))
            stats.files += result.files
            stats.bytes += result.bytes
        logger.info(
            "batch %d: %s in %.2fs (%s written, %s rejected, %d file(s))", batch_id,
            "skipped (already committed)" if result.skipped else "committed", elapsed,
            result.info.get("written", 0), result.info.get("rejected", 0), result.files,
        )
