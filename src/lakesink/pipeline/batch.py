"""The ``foreachBatch`` function: one micro-batch from raw records to a committed table.

Per batch:

1. **skip** a batch the table already holds (only dead letters still in its outbox are
   published: the crash may have come between the commit and their publishing; they
   are never computed again, so a replay under a changed configuration cannot reject
   other records than the first run did);
2. **decode** every record with Spark functions into a marked frame — the parsed record,
   its timestamp, a rejection marker ``_fail`` and, when the policy needs it, the
   top-level keys the schema lacks ``_extra``;
3. **count** records, rejected records and schema candidates with an observation on
   the write itself, so the Kafka read and the decode happen once; when a record calls
   for a schema change, that write is abandoned before anything is committed (Parquet:
   the staged files are dropped; Delta: a guard fails the job before Delta's commit);
4. **evolve** the schema when the policy allows and the counts say so (new columns,
   widened types; :mod:`lakesink.decode.evolution`), store it, and decode again;
5. **write** the good rows through the table writer; the rejected ones are staged in
   the dead-letter outbox *before* the table's commit point and published after it
   (:class:`~lakesink.tables.rejected.RejectedWriter`).

Exactly-once is the table writer's contract (:mod:`lakesink.tables.base`); this
function is deterministic for a given batch, which is what that contract needs. A
schema evolved by a batch is stored *before* that batch's write, so a replay after a
crash decodes the batch with the schema its files were (or will be) written with.
"""

from __future__ import annotations

import datetime as dt
import logging
import operator
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import StorageLevel
from pyspark.sql import Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.decode.registered import (
    INCOMPATIBLE_SCHEMA,
    UNRESOLVED,
    RegistryDecoder,
    schema_id,
)
from lakesink.decode.base import Decoder, combine
from lakesink.decode.evolution import WIDEST, EvolutionPolicy, evolve, widenable
from lakesink.decode.json import SCHEMA_MISMATCH, _path, infer_schema
from lakesink.errors import ConfigError, FilesRefused
from lakesink.faults import fault_point
from lakesink.observe.logs import log_context
from lakesink.observe.metrics import METRICS
from lakesink.observe.telemetry import batch_span, phase
from lakesink.pipeline.arrow_path import (
    arrow_spec,
    stage_in_tasks,
    suspects_frame,
    time_settings_refusal,
)
from lakesink.pipeline.arrow_task import TaskSpec
from lakesink.pipeline.columns import PartitionSpec, SourceColumns
from lakesink.pipeline.transforms import FAILED_INDEX, TRANSFORM_FAILED, Transforms
from lakesink.tables.base import BatchResult, TableWriter
from lakesink.tables.delta import DeltaTableWriter
from lakesink.tables.fs import join
from lakesink.tables.identity import run_tag
from lakesink.tables.parquet import ParquetTableWriter
from lakesink.tables.rejected import RejectedWriter

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from lakesink.catalog.outbox import Registrar
    from lakesink.pipeline.arrow_path import StagedByTasks

logger = logging.getLogger(__name__)

INVALID_TIMESTAMP = "invalid_timestamp"
INVALID_PARTITION_VALUE = "invalid_partition_value"
TOO_MANY_FIELDS = "too_many_fields"
# rows of new fields sampled to type them (the rest are decoded with those types)
EVOLUTION_SAMPLE = 10_000
# how often one batch may evolve the schema before leftovers count as unknown
MAX_EVOLUTIONS_PER_BATCH = 3
UNKNOWN_NAMES_REPORTED = 20
# the error a guarded write raises for a row that needs a schema change
GUARD_MESSAGE = "lakesink: this batch needs a schema change or its dead letters staged first"
# reasons of the "schema" stage (the value decoded but does not fit the table); the
# rest are "decode" (the value could not be read at all)
SCHEMA_REASONS = ("schema_mismatch", "missing_required", "unknown_field", INVALID_TIMESTAMP,
                  INVALID_PARTITION_VALUE, INCOMPATIBLE_SCHEMA, TOO_MANY_FIELDS)

# (schema, changes, batch id) -> None: store an evolved schema durably
SchemaStore = Callable[[T.StructType, list[str], int], None]
# schema -> (decoder, partitions, payload columns after the transforms) for that schema
Rebuild = Callable[[T.StructType], tuple[Decoder, PartitionSpec, T.StructType]]


@dataclass
class RunStats:
    """Totals of one ``lakesink run`` (this process only)."""

    batches: int = 0
    skipped: int = 0
    records: int = 0
    written: int = 0
    rejected: int = 0
    unknown_dropped: int = 0
    schema_changes: int = 0
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    #: with a catalog: batches registered, and committed batches still waiting at stop
    registered: int | None = None
    unregistered: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


class BatchProcessor:
    def __init__(
        self,
        *,
        schema: T.StructType,
        policy: EvolutionPolicy,
        rebuild: Rebuild,
        store_schema: SchemaStore,
        writer: TableWriter,
        rejected: RejectedWriter,
        app_id: str,
        source_columns: SourceColumns | None = None,
        transforms: Transforms | None = None,
        engine: str = "spark",
        task_filesystem: tuple[str, dict[str, Any]] | str = "no filesystem for the tasks",
        registrar: Registrar | None = None,
    ) -> None:
        """``registrar``: registers each committed batch in a catalog (after its commit
        and its dead letters; :mod:`lakesink.catalog.outbox`); ``engine``: ``spark`` (JVM row expressions), ``arrow`` (pyarrow in the tasks;
        refused at start for a table it cannot write) or ``auto`` (arrow where it can);
        ``task_filesystem``: where the Arrow tasks write
        (:func:`~lakesink.runtime.storage.task_filesystem`)."""
        self.engine = engine
        self.task_filesystem = task_filesystem
        self.arrow: TaskSpec | None = None
        self._said_refused: str | None = None  # why a Delta table refuses files, as said
        self.source_columns = source_columns or SourceColumns()
        self.transforms = transforms or Transforms([])
        self.policy = policy
        self.rebuild = rebuild
        self.store_schema = store_schema
        self.writer = writer
        self.rejected = rejected
        self.registrar = registrar
        self.app_id = app_id
        self.stats = RunStats()
        self._span: Any = None  # the running batch's trace span (with OpenTelemetry)
        self._use(schema)

    def _use(self, schema: T.StructType) -> None:
        """Decode with ``schema`` from now on (at start and after an evolution)."""
        self.schema = schema
        self.decoder, self.partitions, self.columns = self.rebuild(schema)
        if self.engine != "spark":
            self._choose_engine()
        # Column expressions built once per schema and reused by every batch: they name
        # columns, so they do not depend on the batch's DataFrame, and building them
        # anew (hundreds of py4j calls) cost ~0.6 s of driver time per batch
        self._exprs: dict[Any, Any] = {}

    def _choose_engine(self) -> None:
        """Use the Arrow path when this table and schema allow it (see
        :func:`~lakesink.pipeline.arrow_path.arrow_spec`)."""
        spec = arrow_spec(decoder=self.decoder, transforms=self.transforms,
                          writer=self.writer, schema=self.schema,
                          partitions=self.partitions, source_columns=self.source_columns,
                          filesystem=self.task_filesystem,
                          time_refusal=time_settings_refusal(self.writer.spark))
        was = self.arrow
        self.arrow = spec if isinstance(spec, TaskSpec) else None
        if self.arrow is None and self.engine == "arrow" and not spec.by_schema:
            # a configuration the path cannot take is refused; a schema (declared, or
            # evolved by the stream) it cannot read takes the Spark path, said below
            raise ConfigError("table.engine", f"arrow: {spec}; use engine auto or spark")
        if self.arrow is None and (was is not None or self.engine == "auto"
                                   or spec.by_schema):
            logger.info("%s: Spark data path (%s)", self.writer.layout.table, spec)
        elif self.arrow is not None and was is None:
            logger.info("%s: Arrow data path", self.writer.layout.table)

    def _memo(self, key: Any, build: Callable[[], Any]) -> Any:  # noqa: ANN401
        if key not in self._exprs:
            self._exprs[key] = build()
        return self._exprs[key]

    @property
    def record(self) -> str:
        """The column table rows come from: the decoded record (``_r``), one of an
        exploding decoder's rows (``_x``), or either after the transforms (``_t``)."""
        if self.transforms:
            return "_t"
        return "_x" if self.decoder.explodes else "_r"

    # -- decoding ------------------------------------------------------------------------

    def _marked(self, df: DataFrame) -> DataFrame:
        """Raw columns, the parsed record ``_r``, the transformed record ``_t`` (with
        transforms), its UTC timestamp ``_ts`` (when a timestamp column is configured),
        the unknown keys ``_extra`` (every policy needs them: to add, report or reject)
        and the rejection marker ``_fail``."""
        plan = self._memo(("marked", "headers" in df.columns),
                          lambda: self._marked_plan("headers" in df.columns))
        base = df.select(*plan.select).withColumn("_extra", plan.extra)
        if plan.explode is not None:
            base = base.withColumn("_fail", plan.decode_fail).withColumn("_x", plan.explode)
        if self.transforms:  # resolved against the batch's record type
            base = self.transforms.apply(base, "_x" if plan.explode is not None else "_r",
                                         "_t")
        if plan.ts is not None:
            base = base.withColumn("_ts", plan.ts)
        return base.withColumn("_fail", plan.fail)

    def _marked_plan(self, headers: bool) -> _MarkedPlan:
        """The expressions of :meth:`_marked`, built once per schema."""
        select = [
            "key", "value", "topic", "partition", "offset",
            F.col("timestamp").alias("kafka_timestamp"), "timestampType",
            *(["headers"] if headers else []),
            self.decoder.parse(F.col("value")).alias("_r"),
        ]
        extra = self.decoder.unknown_keys(F.col("value"), F.col("_r"))
        fail = self.decoder.failure(F.col("value"), F.col("_r"), F.col("_extra"))
        decode_fail = explode = None
        if self.decoder.explodes:  # a good record -> its rows; a rejected one stays one row
            decode_fail = fail
            explode = F.explode(
                F.when(F.col("_fail").isNull(), self.decoder.rows(F.col("_r")))
                .otherwise(F.array(F.lit(None).cast(self.decoder.schema))))
            fail = F.col("_fail")
        if self.transforms:
            fail = F.coalesce(fail, F.when(F.col(FAILED_INDEX).isNotNull(),
                                           F.lit(TRANSFORM_FAILED)))
        ts = None
        if self.partitions.timestamp_column is not None:
            ts, invalid = self.partitions.timestamp(F.col(self.record), F.col("kafka_timestamp"))
            fail = F.coalesce(fail, F.when(invalid, F.lit(INVALID_TIMESTAMP)))
        folders = self.partitions.unfit_folders(F.col(self.record), self.columns)
        if folders is not None:
            fail = F.coalesce(fail, F.when(folders[0], F.lit(INVALID_PARTITION_VALUE)))
        if self.policy.adds_columns:  # one record must not widen the table without bound
            fail = F.coalesce(fail, F.when(F.size("_extra") > F.lit(self._room()),
                                           F.lit(TOO_MANY_FIELDS)))
        return _MarkedPlan(select, extra, decode_fail, explode, ts, fail)

    def _room(self) -> int:
        """How many columns schema evolution may still add (``table.max_columns``); 0 for
        a table already at or over it (declared, inferred or resolved that wide)."""
        return max(0, self.policy.max_columns - len(self.schema.fields))

    def _widenable(self) -> list[T.StructField]:
        if not self.policy.type_widening:
            return []
        return [f for f in self.schema.fields if widenable(f)]

    def _aggregates(self) -> list[Column]:
        """Records, rejected, records with unknown fields, widening candidates (over the
        columns of :meth:`_marked`)."""
        return self._memo("aggregates", self._aggregates_plan)

    def _aggregates_plan(self) -> list[Column]:
        aggs = [F.count(F.lit(1)).alias("records"), F.count(F.col("_fail")).alias("rejected")]
        if self.policy.watches_unknown:
            aggs.append(F.count_if((F.size("_extra") > 0) & F.col("_fail").isNull())
                        .alias("unknown"))
        if self._widenable():
            aggs.append(F.count_if(F.col("_fail") == F.lit(SCHEMA_MISMATCH)).alias("mismatch"))
        if self._resolves_ids:
            aggs.append(F.count_if(F.col("_fail") == F.lit(UNRESOLVED)).alias("unresolved"))
        return aggs

    @property
    def _resolves_ids(self) -> bool:
        """Whether the decoder looks records' schema ids up in a registry (records of
        an id new to the run are marked :data:`UNRESOLVED` until it has)."""
        return isinstance(self.decoder, RegistryDecoder)

    def _observed(self, observation: Observation, marked: DataFrame) -> dict[str, int]:
        """The counts an observation collected during a write; when Spark reports none
        (seen with tiny streaming batches), they are computed with one more pass."""
        try:
            values = observation.get
        except Exception as exc:  # noqa: BLE001 - py4j surfaces Spark's assertion
            logger.debug("observation unavailable (%s): counting again", type(exc).__name__)
            values = {}
        if "records" not in values:
            row = marked.agg(*self._aggregates()).first()
            values = row.asDict() if row is not None else {}
        return {k: int(v or 0) for k, v in values.items()}

    def _count(self, marked: DataFrame) -> dict[str, int]:
        """:meth:`_aggregates` in one pass over ``marked`` (which that pass caches)."""
        aggs = self._aggregates()
        # observed on a no-op write: one stage, no shuffle for the aggregate
        observation = Observation(f"lakesink_count_{time.monotonic_ns()}")
        marked.observe(observation, *aggs).write.format("noop").mode("overwrite").save()
        return {k: int(v or 0) for k, v in observation.get.items()}

    # -- evolution -----------------------------------------------------------------------

    def _new_fields(self, marked: DataFrame) -> T.StructType:
        """Types of the unknown fields, inferred from (a sample of) the records with them."""
        rows = (marked.where((F.size("_extra") > 0) & F.col("_fail").isNull())
                .select(F.col("value").cast("string")).limit(EVOLUTION_SAMPLE).collect())
        return self._addable(infer_schema(self.writer.spark, [r[0] for r in rows]))

    def _resolve_ids(self, marked: DataFrame) -> tuple[T.StructType, dict[str, T.DataType]]:
        """Look the batch's new schema ids up (a registry decoder); the columns and
        widenings their writer schemas ask of the table."""
        assert isinstance(self.decoder, RegistryDecoder)
        rows = (marked.where(F.col("_fail") == F.lit(UNRESOLVED))
                .select(schema_id(F.col("value")).alias("id")).distinct().collect())
        new_fields, widen = self.decoder.new_ids([r["id"] for r in rows])
        return self._addable(new_fields), widen

    def _addable(self, inferred: T.StructType) -> T.StructType:
        """The fields of ``inferred`` that may become columns (not a case-variant of a
        column, nor a reserved name)."""
        taken = {n.lower() for n in self.columns.fieldNames()}
        fields = []
        for f in inferred.fields:
            if (f.name.lower() in taken or f.name.startswith("_lakesink")
                    or f.name in self.source_columns.names
                    or (self.transforms and f.name.lower() == "kafka")):
                continue  # a case-variant of a column (or a reserved name) stays unknown
            taken.add(f.name.lower())
            fields.append(f)
        return T.StructType(fields)

    def _widenings(self, marked: DataFrame) -> dict[str, T.DataType]:
        """Columns whose rejected values only need a wider type of the column's family."""
        candidates = self._widenable()
        bad = marked.where(F.col("_fail") == F.lit(SCHEMA_MISMATCH))
        variant = F.try_parse_json(F.col("value").cast("string"))
        aggs = []
        for f in candidates:
            parsed = F.col("_r")[f.name]
            got = F.try_variant_get(variant, _path(f.name), "variant")
            if isinstance(f.dataType, T.FloatType):
                aggs.append(F.count_if(F.abs(parsed) == F.lit(float("inf"))).alias(f.name))
            else:  # integral: a whole number that overflowed the column's type
                whole = parsed.isNull() & (F.schema_of_variant(got) == F.lit("BIGINT"))
                aggs.append(F.max(F.when(whole, F.abs(
                    F.try_variant_get(variant, _path(f.name), "bigint")))).alias(f.name))
        row = bad.agg(*aggs).first() if aggs else None
        widen: dict[str, T.DataType] = {}
        for f in candidates:
            value = row[f.name] if row is not None else None
            if not value:
                continue
            if isinstance(f.dataType, T.FloatType):
                widen[f.name] = WIDEST[T.FloatType]
            else:
                widen[f.name] = _narrowest_integral(int(value))
        return widen

    def _evolve(self, marked: DataFrame, counts: dict[str, int], batch_id: int) -> bool:
        """Evolve and store the schema if this batch needs it; True when it changed."""
        resolved = bool(counts.get("unresolved"))
        if resolved:  # the decoder is rebuilt below even if the schema stays
            new_fields, widen = self._resolve_ids(marked)
        else:
            new_fields = (self._new_fields(marked)
                          if self.policy.adds_columns and counts.get("unknown") else None)
            if new_fields is not None and len(new_fields.fields) > self._room():
                # records that each fit may together pass the cap: the first fields
                # (by name) become columns; a record with any of the rest is a dead
                # letter (too_many_fields) when the batch is marked again
                kept = sorted(new_fields.fields, key=lambda f: f.name)[: self._room()]
                logger.warning("batch %d: %d new field(s), room for %d under "
                               "table.max_columns=%d", batch_id, len(new_fields.fields),
                               len(kept), self.policy.max_columns)
                new_fields = T.StructType(kept)
            widen = self._widenings(marked) if counts.get("mismatch") else {}
        schema, changes = evolve(self.schema, new_fields=new_fields, widen=widen)
        if not changes:
            if resolved:
                self._use(self.schema)
            return resolved
        self.store_schema(schema, changes, batch_id)
        fault_point("after_schema_evolved", batch_id)
        logger.warning("batch %d: table schema evolved: %s", batch_id, "; ".join(changes))
        self._use(schema)
        self.stats.schema_changes += len(changes)
        return True

    def _unknown_names(self, marked: DataFrame) -> list[str]:
        rows = (marked.where(F.col("_fail").isNull())
                .select(F.explode("_extra").alias("k")).distinct()
                .limit(UNKNOWN_NAMES_REPORTED).collect())
        return sorted(r["k"] for r in rows)

    # -- rejected rows -------------------------------------------------------------------

    def rejected_rows(self, marked: DataFrame, batch_id: int) -> DataFrame:
        bad = marked.where(F.col("_fail").isNotNull())
        reason, detail = self.decoder.explain(F.col("value"), F.col("_r"))
        ts_col = self.partitions.timestamp_column
        is_ts = F.col("_fail") == F.lit(INVALID_TIMESTAMP)
        ts_detail = F.concat(
            F.lit(f"{ts_col}: cannot read "),
            F.coalesce(F.col(self.record)[ts_col].cast("string"), F.lit("?")) if ts_col
            else F.lit("?"),
            F.lit(" as a timestamp (epoch s/ms/us/ns or ISO-8601)"),
        )
        folders = self.partitions.unfit_folders(F.col(self.record), self.columns)
        if folders is not None:  # the first check that failed names the reason
            is_folder = F.col("_fail") == F.lit(INVALID_PARTITION_VALUE)
            reason = F.when(is_folder, F.lit(INVALID_PARTITION_VALUE)).otherwise(reason)
            detail = F.when(is_folder, folders[1]).otherwise(detail)
        if self.policy.adds_columns:
            is_wide = F.col("_fail") == F.lit(TOO_MANY_FIELDS)
            reason = F.when(is_wide, F.lit(TOO_MANY_FIELDS)).otherwise(reason)
            detail = F.when(is_wide, F.concat(
                F.size("_extra").cast("string"),
                F.lit(f" fields outside the schema ({len(self.schema.fields)} columns): "
                      f"more than table.max_columns ({self.policy.max_columns}) allows"))
            ).otherwise(detail)
        stage = (F.when(is_ts | reason.isin(*SCHEMA_REASONS), F.lit("schema"))
                 .otherwise(F.lit("decode")))
        if self.transforms:
            is_tf = F.col("_fail") == F.lit(TRANSFORM_FAILED)
            described = F.array(*[F.lit(self.transforms.describe(i) + " raised an error")
                                  for i in range(len(self.transforms.items))])
            tf_detail = F.element_at(described, F.col(FAILED_INDEX) + 1)
            reason = F.when(is_tf, F.lit(TRANSFORM_FAILED)).otherwise(reason)
            detail = F.when(is_tf, tf_detail).otherwise(detail)
            stage = F.when(is_tf, F.lit("transform")).otherwise(stage)
        return bad.select(
            "key", "value",
            F.when(is_ts, F.lit(INVALID_TIMESTAMP)).otherwise(reason).alias("reason"),
            F.when(is_ts, ts_detail).otherwise(detail).alias("detail"),
            stage.alias("stage"),
            "topic", "partition", "offset", "kafka_timestamp",
            F.lit(batch_id).cast("long").alias("batch_id"),
            F.lit(self.app_id).alias("app_id"),
            F.lit(dt.datetime.now(dt.UTC).replace(tzinfo=None)).cast("timestamp")
            .alias("rejected_at"),
        )

    # -- one batch -----------------------------------------------------------------------

    def close(self) -> None:
        try:
            if self.registrar is not None:
                self.registrar.close()
                self.stats.registered = self.registrar.registered
                self.stats.unregistered = len(self.registrar.pending)
        finally:
            self.writer.close()
            self.rejected.close()

    def _register(self, batch_id: int) -> None:
        """The committed batch goes to the catalog (or waits in the outbox)."""
        if self.registrar is not None:
            with phase("catalog", self.writer.layout.name):
                self.registrar.committed(batch_id)

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        table = self.writer.layout.name
        with log_context(table=table, batch_id=batch_id), batch_span(table, batch_id) as span:
            self._span = span
            self._batch(df, batch_id)

    def _batch(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        changes_before = self.stats.schema_changes
        if self.writer.is_committed(batch_id):
            self._replayed(batch_id, started)
            return
        self.rejected.discard(batch_id)  # an earlier attempt's: this one stages its own
        if self.arrow is not None:
            write = self._write_arrow
        else:
            write = (self._write_staged if self.writer.stages_before_commit
                     else self._write_guarded)
        with phase("write", self.writer.layout.name):
            result, counts, info, marked = write(df, batch_id)
        if marked is not None:
            marked.unpersist()
        if result.skipped:  # committed meanwhile (cannot happen with one writer)
            self._replayed(batch_id, started)
            return
        reasons = (self.rejected.reasons(batch_id)
                   if counts["rejected"] and METRICS.by_reason else {})
        if counts["rejected"]:  # staged before the commit; published now
            with phase("dead_letters", self.writer.layout.name):
                self.rejected.publish(batch_id)
            logger.warning("batch %d: %d record(s) rejected -> %s", batch_id,
                           counts["rejected"], self.rejected.path(batch_id))
        self._register(batch_id)
        stats = self.stats
        stats.batches += 1
        stats.seconds += time.monotonic() - started
        stats.records += counts["records"]
        stats.written += info["written"]
        stats.rejected += counts["rejected"]
        stats.unknown_dropped += counts.get("unknown", 0)
        stats.files += result.files
        stats.bytes += result.bytes
        if self._span is not None:
            self._span.set_attributes({
                "lakesink.records": counts["records"], "lakesink.written": info["written"],
                "lakesink.rejected": counts["rejected"], "lakesink.files": result.files,
                "lakesink.bytes": result.bytes})
        METRICS.committed(
            self.writer.layout.name, records=counts["records"], written=info["written"],
            rejected=reasons, unknown_dropped=counts.get("unknown", 0), files=result.files,
            size=result.bytes, seconds=time.monotonic() - started,
            schema_changes=stats.schema_changes - changes_before,
            pending=len(self.registrar.pending) if self.registrar is not None else None,
            batch_id=batch_id)
        logger.info("batch %d: committed in %.2fs (%d written, %d rejected, %d file(s))",
                    batch_id, time.monotonic() - started, info["written"], counts["rejected"],
                    result.files)

    def _stage_rejected(self, marked: DataFrame, counts: dict[str, int], batch_id: int
                        ) -> None:
        """Stage the batch's dead letters before the table's commit (see
        :class:`~lakesink.tables.rejected.RejectedWriter`); ``counts["rejected"]``
        becomes the number staged (checked against an exact count if they differ)."""
        if counts["rejected"]:
            counts["rejected"] = self.rejected.stage(
                batch_id, self.rejected_rows(marked, batch_id), expected=counts["rejected"],
                recount=lambda: marked.where(F.col("_fail").isNotNull()).count())

    def _recount(self, df: DataFrame) -> Callable[[], int]:
        """An exact count of the batch's good rows (a Spark job over the raw rows),
        for a writer whose observed count disagrees with what it wrote."""
        return lambda: self._good(self._marked(df)).count()

    def _needs_evolution(self, counts: dict[str, int]) -> bool:
        """Whether the schema (or, for new schema ids, the decoder) must change first;
        a registry decoder's unknown fields are ones its writers' resolution already
        left out (case-variants of columns, reserved names)."""
        return bool((counts.get("unknown") and self.policy.adds_columns
                     and not self._resolves_ids)
                    or counts.get("mismatch") or counts.get("unresolved"))

    def _info(self, counts: dict[str, int], marked: DataFrame, batch_id: int) -> dict[str, Any]:
        """What is recorded with the commit; reports fields dropped as unknown."""
        info: dict[str, Any] = {"records": counts["records"], "rejected": counts["rejected"],
                                "written": counts["records"] - counts["rejected"],
                                "schema_fields": len(self.schema.fields)}
        if counts.get("unknown"):
            names = self._unknown_names(marked)
            info["unknown_fields_dropped"] = {"records": counts["unknown"], "names": names}
            logger.warning("batch %d: %d record(s) had fields outside the schema, dropped: %s",
                           batch_id, counts["unknown"], ", ".join(names))
        return info

    def _guard(self) -> Column | None:
        """True for rows that would change the schema (an unknown field under
        add_columns; a mismatch when widening is allowed) and for rejected rows (their
        dead letters are staged before the commit, by :meth:`_write_counted`)."""
        checks = [F.col("_fail").isNotNull()]
        if self.policy.adds_columns:
            checks.append(F.col("_fail").isNull() & (F.size("_extra") > 0))
        if self._widenable():
            checks.append(F.col("_fail") == F.lit(SCHEMA_MISMATCH))
        return combine(operator.or_, checks) if checks else None

    def _good(self, marked: DataFrame, *, guarded: bool = False) -> DataFrame:
        """The good rows as table columns. ``guarded``: a row that would change the
        schema fails the job (see :meth:`_write_guarded`)."""
        keep, columns = self._memo(("good", guarded), lambda: self._good_plan(guarded))
        return marked.where(keep).select(*columns)

    def _good_plan(self, guarded: bool) -> tuple[Column, list[Column]]:
        ts = F.col("_ts") if self.partitions.timestamp_column is not None else None
        keep = F.col("_fail").isNull()
        guard = self._guard() if guarded else None
        if guard is not None:
            keep = F.when(guard, F.raise_error(F.lit(GUARD_MESSAGE))).otherwise(keep)
        return keep, [*self.partitions.output_columns(F.col(self.record), self.columns, ts),
                      *self.source_columns.columns()]

    def _write_guarded(self, df: DataFrame, batch_id: int) -> tuple[Any, ...]:
        """Tables whose write is the commit (Delta), in one pass: the write counts (an
        observation) and carries a guard that fails its job — before the table commits
        anything — when a row calls for a schema change or is rejected. Such a batch
        (the first batch with a new field; a batch with bad records) is then written by
        :meth:`_write_counted`, which stages its dead letters before the commit."""
        marked = self._marked(df)
        observation = Observation(f"lakesink_batch_{batch_id}_{time.monotonic_ns()}")
        observed = marked.observe(observation, *self._aggregates())
        seen: dict[str, Any] = {}

        def commit_info() -> dict[str, Any]:
            seen["counts"] = self._observed(observation, marked)
            seen["info"] = self._info(seen["counts"], marked, batch_id)
            return seen["info"]

        try:
            result = self.writer.write_batch(batch_id, self._good(observed, guarded=True),
                                             commit_info=commit_info,
                                             recount=self._recount(df))
        except Exception as exc:
            if GUARD_MESSAGE not in str(exc):
                raise
            logger.info("batch %d: a record calls for a schema change or is rejected; the "
                        "write was stopped before its commit and runs again after the "
                        "change and the dead letters are staged", batch_id)
            return self._write_counted(df, batch_id)
        return result, seen.get("counts") or {"records": 0, "rejected": 0}, \
            seen.get("info") or {"written": 0}, marked

    def _write_counted(self, df: DataFrame, batch_id: int) -> tuple[Any, ...]:
        """Tables whose write is the commit (Delta), when the schema must change or
        records are rejected: count (and evolve) first, on a cached decode, stage the
        dead letters, then write once."""
        marked = self._marked(df).persist(StorageLevel.MEMORY_AND_DISK_DESER)
        try:
            counts = self._count(marked)
            for _ in range(MAX_EVOLUTIONS_PER_BATCH):
                if not self._needs_evolution(counts) or not self._evolve(marked, counts,
                                                                          batch_id):
                    break
                marked.unpersist()
                marked = self._marked(df).persist(StorageLevel.MEMORY_AND_DISK_DESER)
                counts = self._count(marked)
            self._stage_rejected(marked, counts, batch_id)
            info = self._info(counts, marked, batch_id)
            result = self.writer.write_batch(batch_id, self._good(marked),
                                             commit_info=lambda: info,
                                             recount=lambda: self._good(marked).count())
        except BaseException:
            marked.unpersist()
            raise
        return result, counts, info, marked

    def _write_staged(self, df: DataFrame, batch_id: int) -> tuple[Any, ...]:
        """Tables that stage before they commit (Parquet): one pass that writes and
        counts; if the counts call for a schema change, the staged files are dropped
        (nothing was published), the schema evolves and the batch is written again."""
        evolve_allowed = True
        for attempt in range(MAX_EVOLUTIONS_PER_BATCH + 1):
            marked = self._marked(df)
            observation = Observation(f"lakesink_batch_{batch_id}_{time.monotonic_ns()}")
            observed = marked.observe(observation, *self._aggregates())
            seen: dict[str, Any] = {}

            def commit_info(observation: Observation = observation, marked: DataFrame = marked,
                            seen: dict[str, Any] = seen, allowed: bool = evolve_allowed,
                            last: bool = attempt == MAX_EVOLUTIONS_PER_BATCH
                            ) -> dict[str, Any]:
                counts = self._observed(observation, marked)
                seen["counts"] = counts
                if allowed and not last and self._needs_evolution(counts):
                    raise _EvolveFirst
                self._stage_rejected(marked, counts, batch_id)
                seen["info"] = self._info(counts, marked, batch_id)
                return seen["info"]

            try:
                result = self.writer.write_batch(batch_id, self._good(observed),
                                                 commit_info=commit_info,
                                                 recount=self._recount(df))
            except _EvolveFirst:
                evolve_allowed = self._evolve(marked, seen["counts"], batch_id)
                continue
            return result, seen.get("counts") or {"records": 0, "rejected": 0}, \
                seen.get("info") or {"written": 0}, marked
        raise AssertionError("unreachable: the last attempt never evolves")

    def _write_arrow(self, df: DataFrame, batch_id: int) -> tuple[Any, ...]:
        """The Arrow path (:mod:`lakesink.pipeline.arrow_path`): the tasks stage what
        they certify; Spark's decoder takes the suspects (dead letters, schema changes,
        records only Spark reads); then the staged files are committed together."""
        if isinstance(self.writer, DeltaTableWriter):
            return self._write_arrow_delta(df, batch_id)
        writer = self.writer
        assert isinstance(writer, ParquetTableWriter)
        for attempt in range(MAX_EVOLUTIONS_PER_BATCH + 1):
            if self.arrow is None:  # an evolved schema the Arrow path does not read
                return self._write_staged(df, batch_id)
            if writer.skip_committed(batch_id):
                return BatchResult(batch_id, skipped=True), {}, {}, None
            rows_per_file = writer.begin(batch_id)
            staging = writer.layout.staging(writer.run, batch_id)
            tasks = stage_in_tasks(df, self.arrow, join(staging, "a"), rows_per_file)
            if self._overflowed(tasks, batch_id):  # Spark's path does it in one pass
                return self._write_staged(df, batch_id)
            fault_point("after_staging", batch_id)
            suspects = self._judge_suspects(df, tasks)
            if (suspects.found is not None and attempt < MAX_EVOLUTIONS_PER_BATCH
                    and self._needs_evolution(suspects.found)
                    and self._evolve(suspects.marked, suspects.found, batch_id)):
                suspects.drop()
                continue  # the whole batch again, with the new schema
            counts = self._settle_suspects(suspects, tasks, batch_id)
            spark_files = []
            if suspects.accepted:
                folder = join(staging, "s")
                writer.stage(self._good(suspects.marked), folder, rows_per_file)
                spark_files = writer.listed(folder)
            info, recount = self._arrow_commit_inputs(counts, suspects, tasks, batch_id)
            result = writer.commit_staged(
                batch_id, writer.named(batch_id, tasks.files + spark_files), info,
                rows_per_file, recount=recount)
            return result, counts, info, suspects.marked
        raise AssertionError("unreachable: the last attempt never evolves")

    def _write_arrow_delta(self, df: DataFrame, batch_id: int) -> tuple[Any, ...]:
        """The Arrow path for a Delta table: the tasks write their files in place (names
        carrying the batch and the run; a file is invisible until a commit lists it),
        Spark's decoder judges the suspects (dead letters; the rows it accepts are
        written by Spark and moved in beside the tasks' files), and one delta-rs commit
        adds the files with the batch's ``SetTransaction``. A schema change sends the
        batch to Spark's Delta writer (``mergeSchema``)."""
        writer = self.writer
        assert isinstance(writer, DeltaTableWriter) and self.arrow is not None
        writer.ensure_table(lambda: self._good(self._marked(df.limit(0))))
        refused = writer.files_refusal()
        if refused:
            if self._said_refused != refused:
                logger.warning("%s: Delta batches take Spark's writer: %s",
                               writer.layout.table, refused)
                self._said_refused = refused
            return self._write_guarded(df, batch_id)
        lacking = writer.lacks_columns(self._memo("delta_columns", self._delta_columns))
        if lacking:
            logger.info("batch %d: the Delta table lacks column(s) %s of the schema: the "
                        "batch takes Spark's writer, which adds them", batch_id,
                        ", ".join(lacking))
            return self._write_guarded(df, batch_id)
        rows_per_file = writer.rows_per_file()
        # file names of this attempt: the batch, the run, and a nonce (Spark's task
        # attempt ids restart with every process)
        tag = f"-b{batch_id:010d}-{run_tag(self.app_id)}-{uuid.uuid4().hex[:8]}"
        tasks = stage_in_tasks(df, self.arrow, writer.layout.table, rows_per_file,
                               file_tag=tag)
        if self._overflowed(tasks, batch_id):
            writer.drop_files([rel for rel, *_ in tasks.reported])
            return self._write_guarded(df, batch_id)
        fault_point("after_staging", batch_id)
        suspects = self._judge_suspects(df, tasks)
        try:
            if suspects.found is not None and self._needs_evolution(suspects.found):
                logger.info("batch %d: the schema changes: the batch takes the Spark "
                            "path", batch_id)
                suspects.drop()
                writer.drop_files([rel for rel, *_ in tasks.reported])
                return self._write_guarded(df, batch_id)
            counts = self._settle_suspects(suspects, tasks, batch_id)
            files = list(tasks.reported)
            if suspects.accepted:
                files += writer.stage_in_place(self._good(suspects.marked), batch_id,
                                               rows_per_file, tag)
            info, recount = self._arrow_commit_inputs(counts, suspects, tasks, batch_id)
            result = writer.commit_files(batch_id, files, info, recount=recount)
        except FilesRefused as refused:  # nothing committed: Spark's writer, from scratch
            logger.warning("%s: %s; this batch and the next take Spark's Delta writer",
                           writer.layout.table, refused)
            suspects.drop()
            # the tasks' files and the staged dead letters stay: a put whose fate was
            # unknown may still land and list the files, and Spark's writer then skips
            # the batch by its txn, so the outbox staged here is the batch's; else the
            # Spark path stages its own in its place (stage replaces an outbox)
            return self._write_guarded(df, batch_id)
        except BaseException:
            suspects.drop()
            raise
        return result, counts, info, suspects.marked

    def _delta_columns(self) -> dict[str, str | None]:
        """The columns a Delta table needs for the Arrow path's files: the schema's
        (name -> Spark type name) and the partition, key and metadata columns (any
        type: partition values live in the log, as text)."""
        spec = self.arrow
        assert spec is not None
        columns: dict[str, str | None] = {name: type_name for name, type_name, _ in spec.fields}
        columns.update({c: None for c in (*spec.partition_by, spec.key_column,
                                          spec.metadata_column) if c})
        return columns

    # -- the Arrow path's shared steps ----------------------------------------------------

    def _overflowed(self, tasks: StagedByTasks, batch_id: int) -> bool:
        """Whether a task had more suspects than it hands back (the batch then takes the
        Spark path, which judges every record in one pass anyway)."""
        if tasks.overflow:
            assert self.arrow is not None
            logger.warning("batch %d: too many records the Arrow path does not certify "
                           "(more than %d in a task): the batch takes the Spark path",
                           batch_id, self.arrow.max_suspects)
        return tasks.overflow

    def _judge_suspects(self, df: DataFrame, tasks: StagedByTasks) -> _Suspects:
        """Step 3, first half: the records the tasks did not certify through Spark's
        decoder (the Spark path's own code), counted in one cached pass."""
        if not tasks.suspects.num_rows:
            return _Suspects(None, None)
        marked = self._marked(suspects_frame(df, tasks.suspects)).persist(
            StorageLevel.MEMORY_AND_DISK_DESER)
        try:
            return _Suspects(marked, self._count(marked))
        except BaseException:
            marked.unpersist()
            raise

    def _settle_suspects(self, suspects: _Suspects, tasks: StagedByTasks, batch_id: int
                         ) -> dict[str, int]:
        """Step 3, second half (no schema change pending): the suspects' dead letters
        staged in the outbox; the batch's counts."""
        counts = {"records": tasks.records, "rejected": 0}
        if suspects.found is None:
            return counts
        assert suspects.marked is not None
        self._stage_rejected(suspects.marked, suspects.found, batch_id)
        counts["rejected"] = suspects.found["rejected"]
        if suspects.found.get("unknown"):
            counts["unknown"] = suspects.found["unknown"]
        return counts

    def _arrow_commit_inputs(self, counts: dict[str, int], suspects: _Suspects,
                             tasks: StagedByTasks, batch_id: int
                             ) -> tuple[dict[str, Any], Callable[[], int]]:
        """Step 4's inputs: the commit's info (rows the tasks wrote included), and an
        exact recount of the batch's good rows for a commit whose counts disagree."""
        info = {**self._info(counts, suspects.marked, batch_id), "arrow_rows": tasks.rows}
        good = self._good(suspects.marked) if suspects.marked is not None else None
        return info, lambda: tasks.rows + (good.count() if good is not None else 0)

    def _replayed(self, batch_id: int, started: float) -> None:
        """A batch the table already holds: its dead letters were staged before the
        commit; what the crash left in the outbox is published (never computed again:
        a replay under another configuration would reject other records)."""
        self.writer.tidy(batch_id)
        published = self.rejected.publish(batch_id)
        if published:
            logger.warning("batch %d (replayed): %d rejected record(s) published", batch_id,
                           published)
        self._register(batch_id)
        METRICS.skipped(self.writer.layout.name)
        self.stats.batches += 1
        self.stats.skipped += 1
        self.stats.seconds += time.monotonic() - started
        logger.info("batch %d: skipped (already committed) in %.2fs", batch_id,
                    time.monotonic() - started)


@dataclass(frozen=True)
class _MarkedPlan:
    """Columns of :meth:`BatchProcessor._marked`, in the order they are added."""

    select: list[Any]  # raw columns and the parsed record _r
    extra: Column  # _extra
    decode_fail: Column | None  # _fail before the explode (exploding decoders)
    explode: Column | None  # _x (exploding decoders)
    ts: Column | None  # _ts (with a timestamp column)
    fail: Column  # the final _fail


@dataclass(frozen=True)
class _Suspects:
    """An Arrow batch's suspects as Spark's decoder judged them: the marked frame
    (persisted; the batch function unpersists it) and its counts; both None when the
    tasks certified every record."""

    marked: DataFrame | None
    found: dict[str, int] | None

    @property
    def accepted(self) -> bool:
        """Whether Spark's decoder accepted some of them (rows to write)."""
        return self.found is not None and self.found["records"] > self.found["rejected"]

    def drop(self) -> None:
        if self.marked is not None:
            self.marked.unpersist()


class _EvolveFirst(Exception):
    """Raised from a staged write's commit_info: drop the staged files, evolve, redo."""


def _narrowest_integral(magnitude: int) -> T.DataType:
    if magnitude <= 2**15 - 1:
        return T.ShortType()
    if magnitude <= 2**31 - 1:
        return T.IntegerType()
    return T.LongType()
