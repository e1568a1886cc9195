"""Routing: one stream, several tables. Each record goes to the first route whose topics
(or topic pattern) match its topic; records no route takes are dead letters with the
reason ``unrouted`` (stage ``route``), or dropped when the config says so.

Contract (the same as one table's, per table):

* **Exactly once per table.** Every route's table writer keys its commit by the same
  (checkpoint app id, batch id). A batch replayed after a crash between two tables'
  commits is skipped by the tables that hold it and written by the others.
* **Acknowledged after every table.** The Kafka offsets of a batch are committed by
  Spark only when this function returns, i.e. after every route's table and the
  unrouted dead letters are durable.
* **Deterministic.** Route matching is a Spark expression over the topic name (Java
  regular expressions, whole-name match, as Kafka's ``subscribePattern``).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark import StorageLevel
from pyspark.sql import functions as F

from lakesink.pipeline.batch import BatchProcessor, RunStats

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from lakesink.tables.rejected import RejectedWriter

logger = logging.getLogger(__name__)

UNROUTED = "unrouted"
_ROUTE = "_lakesink_route"


@dataclass
class Route:
    """Records of ``topics`` (or of topics matching ``pattern``) -> ``processor``'s table."""

    topics: list[str]
    pattern: str | None
    processor: BatchProcessor

    def matches(self) -> Column:
        topic = F.col("topic")
        if self.pattern is not None:
            return topic.rlike(f"^(?:{self.pattern})$")
        return topic.isin(*self.topics)


class Router:
    """The ``foreachBatch`` function of a routed config: every route's batch, then the
    unrouted records (``unrouted`` is None when they are dropped)."""

    def __init__(self, routes: list[Route], unrouted: RejectedWriter | None, *,
                 app_id: str, exhaustive: bool = False) -> None:
        self.routes = routes
        self.unrouted = unrouted
        self.app_id = app_id
        # True when the subscription is exactly the routes' topics: nothing can be unrouted
        self.exhaustive = exhaustive
        self.unrouted_records = 0
        self.batches = 0

    @property
    def stats(self) -> RunStats:
        total = RunStats()
        for route in self.routes:
            for key, value in route.processor.stats.as_dict().items():
                setattr(total, key, getattr(total, key) + value)
        total.batches = self.batches
        total.rejected += self.unrouted_records
        return total

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        route = F.coalesce(*[F.when(r.matches(), F.lit(i)) for i, r in enumerate(self.routes)])
        tagged = df.withColumn(_ROUTE, route)
        shared = len(self.routes) > 1 or not self.exhaustive
        if shared:  # several readers of one batch: read Kafka once
            tagged = tagged.persist(StorageLevel.MEMORY_AND_DISK_DESER)
        try:
            for i, r in enumerate(self.routes):
                r.processor(tagged.where(F.col(_ROUTE) == F.lit(i)).drop(_ROUTE), batch_id)
            if not self.exhaustive:
                self._unrouted(tagged.where(F.col(_ROUTE).isNull()).drop(_ROUTE), batch_id)
        finally:
            if shared:
                tagged.unpersist()
        self.batches += 1
        logger.info("batch %d: %d route(s) done in %.2fs", batch_id, len(self.routes),
                    time.monotonic() - started)

    def _unrouted(self, df: DataFrame, batch_id: int) -> None:
        if self.unrouted is None:
            dropped = df.count()
            if dropped:
                logger.warning("batch %d: %d record(s) matched no route, dropped "
                               "(unrouted: drop)", batch_id, dropped)
            return
        rows = df.select(
            "key", "value", F.lit(UNROUTED).alias("reason"),
            F.concat(F.lit("no route takes topic "), F.col("topic")).alias("detail"),
            F.lit("route").alias("stage"), "topic", "partition", "offset",
            F.col("timestamp").alias("kafka_timestamp"),
            F.lit(batch_id).cast("long").alias("batch_id"), F.lit(self.app_id).alias("app_id"),
            F.lit(dt.datetime.now(dt.UTC).replace(tzinfo=None)).cast("timestamp")
            .alias("rejected_at"))
        written = self.unrouted.write(batch_id, rows, only_if_any=True)
        if written:
            self.unrouted_records += written
            logger.warning("batch %d: %d record(s) matched no route -> %s", batch_id, written,
                           self.unrouted.path(batch_id))
