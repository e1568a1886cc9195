"""Routing: one stream, several tables. Each record goes to the first route whose topics
(or topic pattern) match its topic — to the route's table, or, for a message-type route,
to the table its type names; records no route takes are dead letters with the reason
``unrouted`` (stage ``route``), or dropped when the config says so.

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
from collections.abc import Callable
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
    """Records of ``topics`` (or of topics matching ``pattern``) -> ``processor``'s table,
    or, with ``types``, one table per message type."""

    topics: list[str]
    pattern: str | None
    processor: BatchProcessor | None = None
    types: TypeTables | None = None

    def matches(self) -> Column:
        topic = F.col("topic")
        if self.pattern is not None:
            return topic.rlike(f"^(?:{self.pattern})$")
        return topic.isin(*self.topics)

    @property
    def processors(self) -> list[BatchProcessor]:
        if self.types is not None:
            return list(self.types.processors.values())
        return [self.processor] if self.processor is not None else []

    def __call__(self, df: DataFrame, batch_id: int) -> DataFrame | None:
        """Write the route's records; returns its unrouted ones (with a ``detail``)."""
        if self.types is not None:
            return self.types(df, batch_id)
        assert self.processor is not None
        self.processor(df, batch_id)
        return None


# (table name, samples of its records) -> the batch function of that table
TableFactory = Callable[[str, Callable[[], list[str]]], BatchProcessor]
_TYPE = "_lakesink_type"
_TABLE_NAME = "^[A-Za-z0-9][A-Za-z0-9_\\-.]*$"


class TypeTables:
    """Message-type routing: the JSON field ``field`` of each record names its table
    (``prefix`` + type), created on first sight with a schema inferred from that type's
    records. Types outside ``allow``, records without the field, and types whose name
    is not a table name (or whose table cannot be set up) are unrouted."""

    def __init__(self, *, field: str, allow: str | None, prefix: str, factory: TableFactory,
                 reserved: set[str], sample_size: int, key: str) -> None:
        self.field = field
        self.allow = allow
        self.prefix = prefix
        self.factory = factory
        self.reserved = {r.lower() for r in reserved}
        self.sample_size = sample_size
        self.key = key
        self.processors: dict[str, BatchProcessor] = {}
        self.refused: dict[str, str] = {}  # type -> why its table could not be set up

    def _accepted(self, kind: Column) -> Column:
        table = F.concat(F.lit(self.prefix), kind)
        ok = kind.isNotNull() & table.rlike(_TABLE_NAME)
        if self.allow is not None:
            ok = ok & kind.rlike(f"^(?:{self.allow})$")
        if self.reserved:
            ok = ok & ~F.lower(table).isin(*self.reserved)
        return F.coalesce(ok, F.lit(False))

    def _detail(self, kind: Column) -> Column:
        quoted = F.concat(F.lit("message type '"), kind, F.lit("'"))
        refused = F.lit(None).cast("string")
        for name, why in sorted(self.refused.items()):
            refused = F.when(kind == F.lit(name), F.lit(f"message type '{name}': {why}")
                             ).otherwise(refused)
        detail = F.when(kind.isNull(), F.lit(f"no message type field '{self.field}'"))
        if self.allow is not None:
            detail = detail.when(~kind.rlike(f"^(?:{self.allow})$"),
                                 F.concat(quoted, F.lit(f" not allowed by {self.key}.allow")))
        return detail.otherwise(F.coalesce(refused, F.concat(
            quoted, F.lit(" does not make a table name (or names another route's table)"))))

    def __call__(self, df: DataFrame, batch_id: int) -> DataFrame:
        typed = df.withColumn(_TYPE, F.get_json_object(F.col("value").cast("string"),
                                                       f"$.{self.field}"))
        accepted = self._accepted(F.col(_TYPE))
        kinds = sorted(r[0] for r in typed.where(accepted).select(_TYPE).distinct().collect())
        for kind in kinds:
            if kind in self.refused:
                continue
            rows = typed.where(F.col(_TYPE) == F.lit(kind)).drop(_TYPE)
            processor = self.processors.get(kind) or self._create(kind, rows)
            if processor is not None:
                processor(rows, batch_id)
        refused = F.col(_TYPE).isin(*self.refused) if self.refused else F.lit(False)
        return (typed.where(~accepted | refused)
                .withColumn("detail", self._detail(F.col(_TYPE))).drop(_TYPE))

    def _create(self, kind: str, rows: DataFrame) -> BatchProcessor | None:
        from lakesink.errors import ConfigError

        def samples() -> list[str]:
            return [r[0] for r in rows.where(F.col("value").isNotNull())
                    .select(F.col("value").cast("string")).limit(self.sample_size).collect()]

        try:
            processor = self.factory(self.prefix + kind, samples)
        except ConfigError as exc:
            logger.error("message type %r: its table cannot be set up (%s); its records "
                         "are unrouted", kind, exc)
            self.refused[kind] = str(exc)
            return None
        logger.info("message type %r -> table %s", kind, self.prefix + kind)
        self.processors[kind] = processor
        return processor


class Router:
    """The ``foreachBatch`` function of a routed config: every route's batch, then the
    unrouted records (``unrouted`` is None when they are dropped)."""

    def __init__(self, routes: list[Route], unrouted: RejectedWriter | None, *,
                 app_id: str, exhaustive: bool = False) -> None:
        self.routes = routes
        self.unrouted = unrouted
        self.app_id = app_id
        # True when the subscription is exactly the routes' topics and no route splits
        # by message type: nothing can be unrouted
        self.exhaustive = exhaustive and all(r.types is None for r in routes)
        self.unrouted_records = 0
        self.batches = 0

    @property
    def stats(self) -> RunStats:
        total = RunStats()
        for route in self.routes:
            for processor in route.processors:
                for key, value in processor.stats.as_dict().items():
                    setattr(total, key, getattr(total, key) + value)
        total.batches = self.batches
        total.rejected += self.unrouted_records
        return total

    def close(self) -> None:
        for route in self.routes:
            for processor in route.processors:
                processor.close()
        if self.unrouted is not None:
            self.unrouted.close()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        route = F.coalesce(*[F.when(r.matches(), F.lit(i)) for i, r in enumerate(self.routes)])
        tagged = df.withColumn(_ROUTE, route)
        shared = len(self.routes) > 1 or not self.exhaustive
        if shared:  # several readers of one batch: read Kafka once
            tagged = tagged.persist(StorageLevel.MEMORY_AND_DISK_DESER)
        try:
            leftovers = []
            for i, r in enumerate(self.routes):
                left = r(tagged.where(F.col(_ROUTE) == F.lit(i)).drop(_ROUTE), batch_id)
                if left is not None:
                    leftovers.append(left)
            if not self.exhaustive:
                nothing = (tagged.where(F.col(_ROUTE).isNull()).drop(_ROUTE)
                           .withColumn("detail", F.concat(F.lit("no route takes topic "),
                                                          F.col("topic"))))
                for left in leftovers:
                    nothing = nothing.unionByName(left)
                self._unrouted(nothing, batch_id)
        finally:
            if shared:
                tagged.unpersist()
        self.batches += 1
        logger.info("batch %d: %d route(s) done in %.2fs", batch_id, len(self.routes),
                    time.monotonic() - started)

    def _unrouted(self, df: DataFrame, batch_id: int) -> None:
        """``df``: raw records with a ``detail`` column."""
        if self.unrouted is None:
            dropped = df.count()
            if dropped:
                logger.warning("batch %d: %d record(s) matched no route, dropped "
                               "(unrouted: drop)", batch_id, dropped)
            return
        rows = df.select(
            "key", "value", F.lit(UNROUTED).alias("reason"), "detail",
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
