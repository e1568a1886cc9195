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
* **Unrouted records are decided once.** Every route first plans its records (a
  message-type route sets up new types' tables), then the unrouted ones are staged in
  their outbox, *before* any table commits the batch, and published after the tables.
  A replayed batch that some table already holds keeps the first run's unrouted set
  (only what is left in the outbox is published), so a route list changed between the
  crash and the restart cannot drop or double them.
* **Deterministic.** Route matching is a Spark expression over the topic name (Java
  regular expressions, whole-name match, as Kafka's ``subscribePattern``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark import StorageLevel
from pyspark.sql import functions as F

from lakesink.decode.registered import schema_id
from lakesink.decode.base import confluent_framed
from lakesink.decode.registry import WriterSchema
from lakesink.errors import ConfigError, SinkError, SourceError
from lakesink.observe.metrics import METRICS
from lakesink.pipeline.batch import BatchFunction, RunStats
from lakesink.tables.rejected import dead_letter_rows

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from lakesink.decode.registry import SchemaRegistry
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.lease import WriterLease
    from lakesink.tables.rejected import RejectedWriter

logger = logging.getLogger(__name__)

UNROUTED = "unrouted"
# route plans kept per checkpoint (a replay is always of the newest batch)
KEEP_PLANS = 100
_ROUTE = "_lakesink_route"


@dataclass
class Route:
    """Records of ``topics`` (or of topics matching ``pattern``) -> ``processor``'s table,
    or, with ``types``, one table per message type."""

    topics: list[str]
    pattern: str | None
    processor: BatchFunction | None = None
    types: TypeTables | None = None

    def matches(self) -> Column:
        topic = F.col("topic")
        if self.pattern is not None:
            return topic.rlike(f"^(?:{self.pattern})$")
        return topic.isin(*self.topics)

    @property
    def processors(self) -> list[BatchFunction]:
        if self.types is not None:
            return list(self.types.processors.values())
        return [self.processor] if self.processor is not None else []

    def plan(self, df: DataFrame, batch_id: int, decided: list[str] | None = None
             ) -> Planned:
        """Decide where the route's records go, before anything is written (a
        message-type route sets up the tables of new types here; ``decided``: the
        types with a table the batch's first attempt recorded, see :class:`RoutePlans`)."""
        if self.types is not None:
            return self.types.plan(df, batch_id, decided)
        return Planned(df, [])

    def unrouted(self, planned: Planned) -> DataFrame | None:
        """The route's records that no table takes (with a ``detail``)."""
        return self.types.unrouted(planned) if self.types is not None else None

    def write(self, planned: Planned, batch_id: int) -> None:
        if self.types is not None:
            self.types.write(planned, batch_id)
            return
        assert self.processor is not None
        self.processor(planned.df, batch_id)

    def committed(self, batch_id: int) -> bool:
        """Whether any of the route's tables holds ``batch_id``."""
        return any(p.writer.is_committed(batch_id) for p in self.processors)


@dataclass
class Planned:
    """A route's records of one batch (typed, for a message-type route) and the types
    that have a table."""

    df: DataFrame
    kinds: list[str]


# (table name, samples of its records) -> the batch function of that table
TableFactory = Callable[[str, Callable[[], list[str]]], BatchFunction]
_TYPE = "_lakesink_type"
#: the longest table name a type makes: a path component on every store (255 bytes on
#: local disk and HDFS) with room for the file names below it, and a catalog's name
MAX_TABLE_NAME = 128
_TABLE_NAME = f"^[A-Za-z0-9][A-Za-z0-9_\\-.]{{0,{MAX_TABLE_NAME - 1}}}$"


class JsonFieldType:
    """A record's type: the top-level JSON field ``field`` (text)."""

    def __init__(self, field: str) -> None:
        self.field = field
        self.missing = f"no message type field '{field}'"

    def column(self, df: DataFrame, batch_id: int) -> Column:  # noqa: ARG002
        return F.get_json_object(F.col("value").cast("string"), f"$.{self.field}")

    def samples(self, rows: DataFrame, kind: str, size: int) -> list[str]:
        """What a new type's table infers its schema from: its records' values."""
        return [r[0] for r in rows.where(F.col("value").isNotNull())
                .select(F.col("value").cast("string")).limit(size).collect()]


class RecordNameType:
    """A record's type: the full name (``namespace.Name``) of its Avro writer schema,
    looked up by the Confluent framing's schema id in a registry (the batch's new ids,
    on the driver). A record without the framing, or whose id the registry lacks or
    names no Avro record, has no type (unrouted).

    Every id's type is recorded in ``names_dir`` (beside the routed checkpoint) before
    any table commits the batch, one write-once file per id (``<id>.json``), and read
    back at start: a replayed batch routes each record as its first attempt did, even
    if the registry has since lost or gained the id (a registry restored from a
    backup). The first writer of an id wins: a second writer (a stale one whose lease
    is about to be refused) reads the recorded type instead of replacing it, and no
    writer rewrites another id's record."""

    missing = ("no Avro record name: the value lacks the Confluent framing, or its "
               "schema id is not an Avro record in the registry")

    def __init__(self, registry: SchemaRegistry, fs: HadoopFS, names_dir: str, *,
                 short: bool = False) -> None:
        """``short``: the type is the record's name without its namespace (the full
        name is what ``names_dir`` records either way)."""
        self.registry = registry
        self.short = short
        self.fs = fs
        self.names_dir = names_dir.rstrip("/")
        # the single file of earlier versions (rewritten whole per new id), then the
        # per-id files, which win
        stored = fs.read_json(f"{self.names_dir}.json") or {}
        #: resolved names only: an id the registry did not know (an older version's
        #: ``null``) is asked again, its misses kept per batch (:meth:`column`)
        self.names: dict[int, str] = {int(k): v for k, v in stored.items() if v}
        for f in fs.list_files(self.names_dir, suffix=".json"):
            stem = f.relative.removesuffix(".json")
            if stem.isdigit() and (name := self._read(int(stem))) is not None:
                self.names[int(stem)] = name

    def _read(self, sid: int) -> str | None:
        value = self.fs.read_json(f"{self.names_dir}/{sid}.json")
        if not isinstance(value, dict) or "name" not in value:
            raise SourceError(f"{self.names_dir}/{sid}.json is not a record-name entry "
                              "lakesink wrote; restore it or delete the routed checkpoint")
        return value["name"]

    def _kind(self, name: str) -> str:
        return name.rsplit(".", 1)[-1] if self.short else name

    def _record(self, sid: int, name: str) -> str:
        """``sid``'s type as recorded: ``name`` if this writer is the first."""
        path = f"{self.names_dir}/{sid}.json"
        if self.fs.write_once(path, json.dumps({"name": name})):
            return name
        recorded = self._read(sid)
        if recorded is None:  # an older version recorded a miss for good: replace it
            self.fs.delete(path, recursive=False)
            return self._record(sid, name)
        return recorded

    def _misses(self, batch_id: int) -> str:
        return f"{self.names_dir}/misses/{batch_id:010d}.json"

    def column(self, df: DataFrame, batch_id: int) -> Column:
        """Each record's type by its schema id. A name once resolved is recorded for
        good (the first writer's wins); an id the registry does not know is recorded as
        a miss of *this batch* only (write-once, before any table commits it), so a
        replay of the batch routes it the same way while later batches ask again
        (audit-2 #9: a miss used to be recorded for good)."""
        sid = schema_id(F.col("value"))
        framed = confluent_framed(F.col("value"))
        ids = [int(r[0]) for r in df.where(framed).select(sid).distinct().collect()]
        recorded = self.fs.read_json(self._misses(batch_id))
        missed = set(recorded) if isinstance(recorded, list) else set()
        new = [i for i in ids if i not in self.names and i not in missed]
        if new:
            self.registry.lookup(new)
            for i in new:
                writer = self.registry.known.get(i)
                if isinstance(writer, WriterSchema):
                    self.names[i] = self._record(i, writer.record_name)
                else:
                    missed.add(i)
        if missed and recorded is None:
            if not self.fs.write_once(self._misses(batch_id), json.dumps(sorted(missed))):
                again = self.fs.read_json(self._misses(batch_id))  # a racing attempt's
                missed = set(again) if isinstance(again, list) else missed
            self.fs.delete(self._misses(batch_id - KEEP_PLANS), recursive=False)
        kind = F.lit(None).cast("string")
        for i, name in sorted(self.names.items()):
            if i not in missed:
                kind = F.when(sid == F.lit(i), F.lit(self._kind(name))).otherwise(kind)
        return F.when(framed, kind)

    def samples(self, rows: DataFrame, kind: str, size: int) -> list[str]:
        """What a new type's table starts from: the writer schemas (Avro JSON) of that
        record name seen so far (merged by the table)."""
        ids = sorted(i for i, name in self.names.items()
                     if name is not None and self._kind(name) == kind)
        self.registry.lookup(ids)
        return [w.text for w in (self.registry.known.get(i) for i in ids)
                if isinstance(w, WriterSchema)]


class TypeTables:
    """Message-type routing: each record's type (``typer``: a JSON field, or the Avro
    record name) names its table (``prefix`` + type), created on first sight with a
    schema from that type's records. Types outside ``allow``, records without a type,
    and types whose name is not a table name (or whose table cannot be set up) are
    unrouted."""

    def __init__(self, *, typer: JsonFieldType | RecordNameType, allow: str | None,
                 prefix: str, factory: TableFactory, reserved: set[str], sample_size: int,
                 key: str, max_tables: int = 200, made: Collection[str] = ()) -> None:
        self.typer = typer
        #: at most this many tables: the types that have one (``made``: on storage at
        #: start) keep theirs, a new type gets one while there is room (in name order
        #: within a batch, so a replay of the batch decides the same)
        self.max_tables = max_tables
        self.made = {m[len(prefix):] for m in made}
        self._full = False
        self.allow = allow
        self.prefix = prefix
        self.factory = factory
        self.reserved = {r.lower() for r in reserved}
        self.sample_size = sample_size
        self.key = key
        self.processors: dict[str, BatchFunction] = {}
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
        detail = F.when(kind.isNull(), F.lit(self.typer.missing))
        if self.allow is not None:
            detail = detail.when(~kind.rlike(f"^(?:{self.allow})$"),
                                 F.concat(quoted, F.lit(f" not allowed by {self.key}.allow")))
        long = F.length(F.concat(F.lit(self.prefix), kind)) > MAX_TABLE_NAME
        detail = detail.when(long, F.concat(F.lit("message type of "), F.length(kind).cast(
            "string"), F.lit(f" characters: its table name would be over {MAX_TABLE_NAME}")))
        detail = detail.when(self._accepted(kind) & refused.isNull(), F.concat(
            quoted, F.lit(f": the route has made {self.max_tables} tables "
                          f"({self.key}.max_tables)")))
        return detail.otherwise(F.coalesce(refused, F.concat(
            quoted, F.lit(" does not make a table name (or names another route's table)"))))

    def plan(self, df: DataFrame, batch_id: int, decided: list[str] | None = None
             ) -> Planned:
        """The batch's records with their type, and the types with a table (a new
        type's table is set up here; one that cannot be is refused). ``decided``: the
        types the batch's first attempt gave a table (recorded by :class:`RoutePlans`
        before any table committed it): a replay routes as that attempt did, whatever a
        set-up decides now (its schema sample, a catalog): a type then refused stays
        unrouted, and a type then given a table whose set-up fails now fails the batch
        (its records would otherwise land nowhere)."""
        typed = df.withColumn(_TYPE, self.typer.column(df, batch_id))
        if decided is not None:
            return Planned(typed, [k for k in decided if self._decided(typed, k, batch_id)])
        accepted = self._accepted(F.col(_TYPE))
        kinds = sorted(r[0] for r in typed.where(accepted).select(_TYPE).distinct().collect())
        ready = []
        for kind in kinds:
            if kind in self.refused:
                continue
            if kind not in self.processors and not self._room_for(kind):
                continue
            if kind in self.processors or self._create(kind, self._rows(typed, kind)):
                ready.append(kind)
        return Planned(typed, ready)

    def _decided(self, typed: DataFrame, kind: str, batch_id: int) -> bool:
        """The table of ``kind``, which the batch's first attempt routed to, is ready."""
        if kind in self.processors or self._create(kind, self._rows(typed, kind)):
            return True
        raise SinkError(f"batch {batch_id}: message type {kind!r} went to table "
                        f"{self.prefix + kind} in the batch's first attempt, which may have "
                        f"committed it there; that table cannot be set up now "
                        f"({self.refused.get(kind)}): mend that, and the batch is "
                        "finished as it began")

    def _room_for(self, kind: str) -> bool:
        """A new type's table fits under ``max_tables`` (one made before always does)."""
        taken = self.made | set(self.processors) | set(self.refused)  # refused count too
        if kind in self.made or len(taken) < self.max_tables:
            return True
        if not self._full:
            logger.error("routes: %s.max_tables (%d) reached: records of new message "
                         "types are unrouted from now on (first: %r)", self.key,
                         self.max_tables, kind)
            self._full = True
        return False

    @staticmethod
    def _rows(typed: DataFrame, kind: str) -> DataFrame:
        return typed.where(F.col(_TYPE) == F.lit(kind)).drop(_TYPE)

    def unrouted(self, planned: Planned) -> DataFrame:
        """The records of no table: no type, a type refused, or a new type past
        ``max_tables`` (the kinds with a table are at most ``max_tables``: the filter
        stays small however many types a hostile stream invents)."""
        routed = F.col(_TYPE).isin(*planned.kinds) if planned.kinds else F.lit(False)
        return (planned.df.where(~F.coalesce(routed, F.lit(False)))
                .withColumn("detail", self._detail(F.col(_TYPE))).drop(_TYPE))

    def write(self, planned: Planned, batch_id: int) -> None:
        for kind in planned.kinds:
            self.processors[kind](self._rows(planned.df, kind), batch_id)

    def _create(self, kind: str, rows: DataFrame) -> BatchFunction | None:
        def samples() -> list[str]:
            return self.typer.samples(rows, kind, self.sample_size)

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


class RoutePlans:
    """Per batch, the route list it was routed under (a fingerprint) and, per
    message-type route, the types it gave a table, recorded before any table commits the
    batch: a replay of a batch that some table already holds must route it the same way,
    or records would land in two tables (the one that committed under the old routes or
    decision, the one that takes them under the new) or in none. A type's set-up can
    decide differently on a replay (its schema is inferred from a sample of the batch,
    not the same rows every time; a catalog may refuse meanwhile), so its decision is
    recorded, not remade (audit-2 #19)."""

    def __init__(self, fs: HadoopFS, folder: str, fingerprint: str) -> None:
        self.fs = fs
        self.folder = folder
        self.fingerprint = fingerprint

    def _path(self, batch_id: int) -> str:
        return f"{self.folder}/{batch_id:010d}.json"

    def decided(self, batch_id: int) -> dict[str, list[str]]:
        """The types each message-type route (by its index) gave a table in the batch's
        first attempt ({}: a first attempt, or a plan recorded before types were)."""
        plan = self.fs.read_json(self._path(batch_id))
        if plan is None or plan.get("routes") != self.fingerprint:
            return {}
        return dict(plan.get("types") or {})

    def begin(self, batch_id: int, types: dict[str, list[str]] | None = None) -> None:
        """Before any table writes ``batch_id``: refuse it if it began under other routes
        (a table the current routes do not know may hold it already); else record the
        current routes for it, and ``types``: per message-type route, the types with a
        table (a plan already recorded stays: its decisions were followed)."""
        plan = self.fs.read_json(self._path(batch_id))
        if plan is not None and plan.get("routes") == self.fingerprint:
            return
        if plan is not None:
            raise ConfigError(
                "routes",
                f"batch {batch_id} may be partly committed (some routes' tables may hold "
                "it) under another route list than this configuration's; finishing it "
                "with these routes could put its records in two tables, or in none",
                fix="start once with the previous routes (and unrouted setting) to finish "
                "the batch, then change them")
        self.fs.write_json(self._path(batch_id), {"batch_id": batch_id,
                                                  "routes": self.fingerprint,
                                                  "types": types or {}})
        self.fs.delete(self._path(batch_id - KEEP_PLANS), recursive=False)


class Router:
    """The ``foreachBatch`` function of a routed config: every route's batch, then the
    unrouted records (``unrouted`` is None when they are dropped)."""

    def __init__(self, routes: list[Route], unrouted: RejectedWriter | None, *,
                 app_id: str, exhaustive: bool = False, plans: RoutePlans | None = None,
                 lease: WriterLease | None = None) -> None:
        """``lease``: the routed checkpoint's writer lease (held; released by
        :meth:`close`): one process routes a checkpoint's batches, also those whose
        records all go to the unrouted dead letters (no table's lease is taken then)."""
        self.routes = routes
        self.unrouted = unrouted
        self.plans = plans
        self.lease = lease
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
                    setattr(total, key, (getattr(total, key) or 0) + value)
        total.batches = self.batches
        total.rejected += self.unrouted_records
        return total

    def close(self) -> None:
        for route in self.routes:
            for processor in route.processors:
                processor.close()
        if self.unrouted is not None:
            self.unrouted.close()
        if self.lease is not None:
            self.lease.release()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        route = F.coalesce(*[F.when(r.matches(), F.lit(i)) for i, r in enumerate(self.routes)])
        tagged = df.withColumn(_ROUTE, route)
        shared = len(self.routes) > 1 or not self.exhaustive
        if shared:  # several readers of one batch: read Kafka once
            tagged = tagged.persist(StorageLevel.MEMORY_AND_DISK_DESER)
        try:
            # plan first: a message-type route sets up its tables here, so that a
            # restarted batch sees which of them already hold it
            decided = self.plans.decided(batch_id) if self.plans is not None else {}
            plans = [r.plan(tagged.where(F.col(_ROUTE) == F.lit(i)).drop(_ROUTE), batch_id,
                            decided.get(str(i)))
                     for i, r in enumerate(self.routes)]
            replay = any(r.committed(batch_id) for r in self.routes)
            if self.lease is not None:
                self.lease.check()
            if self.plans is not None:
                self.plans.begin(batch_id, {str(i): p.kinds for i, (r, p) in
                                            enumerate(zip(self.routes, plans, strict=True))
                                            if r.types is not None})
            if not self.exhaustive and not replay:
                self._stage_unrouted(tagged, plans, batch_id)
            for r, planned in zip(self.routes, plans, strict=True):
                r.write(planned, batch_id)
            if self.unrouted is not None and not self.exhaustive:
                if self.lease is not None:
                    self.lease.check()
                published = self.unrouted.publish(batch_id)
                if published:
                    self.unrouted_records += published
                    METRICS.records_unrouted.inc(published)
                    logger.warning("batch %d: %d record(s) matched no route -> %s",
                                   batch_id, published, self.unrouted.path(batch_id))
        finally:
            if shared:
                tagged.unpersist()
        self.batches += 1
        logger.info("batch %d: %d route(s) done in %.2fs", batch_id, len(self.routes),
                    time.monotonic() - started)

    def _stage_unrouted(self, tagged: DataFrame, plans: list[Planned], batch_id: int
                        ) -> None:
        """Stage the batch's unrouted records before any table commits the batch (a
        replay that some table already holds publishes what the first run staged)."""
        df = (tagged.where(F.col(_ROUTE).isNull()).drop(_ROUTE)
              .withColumn("detail", F.concat(F.lit("no route takes topic "), F.col("topic"))))
        for r, planned in zip(self.routes, plans, strict=True):
            left = r.unrouted(planned)
            if left is not None:
                df = df.unionByName(left)
        self._unrouted(df, batch_id)

    def _unrouted(self, df: DataFrame, batch_id: int) -> None:
        """``df``: raw records with a ``detail`` column."""
        if self.unrouted is None:
            dropped = df.count()
            if dropped:
                logger.warning("batch %d: %d record(s) matched no route, dropped "
                               "(unrouted: drop)", batch_id, dropped)
            return
        rows = dead_letter_rows(df, reason=F.lit(UNROUTED), detail=F.col("detail"),
                                stage=F.lit("route"), kafka_timestamp=F.col("timestamp"),
                                batch_id=batch_id, app_id=self.app_id)
        self.unrouted.discard(batch_id)
        self.unrouted.stage(batch_id, rows, only_if_any=True)
