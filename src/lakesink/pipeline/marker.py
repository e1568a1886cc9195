"""The mark stage: a batch's raw records -> the marked frame (:mod:`.marks`).

Decode every record with Spark functions (the parsed record), explode and transform it,
give it its UTC timestamp, and mark each record that cannot be written with its reason:
a decode or schema failure, a failed transform, an invalid timestamp, a value that cannot
name a partition folder, more new fields than ``table.max_columns`` leaves room for. The
mark stage also counts a marked frame (:class:`~.marks.BatchCounts`), selects its good
rows as table columns and builds its dead-letter rows. It writes nothing.

Its expressions name columns only, so they are built once per schema (:meth:`use`) and
reused by every batch.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.decode.base import Decoder, combine
from lakesink.decode.evolution import EvolutionPolicy, widenable
from lakesink.decode.json import SCHEMA_MISMATCH
from lakesink.decode.registered import UNRESOLVED, RegistryDecoder
from lakesink.pipeline.columns import PartitionSpec, SourceColumns
from lakesink.pipeline.marks import (
    INVALID_PARTITION_VALUE,
    INVALID_TIMESTAMP,
    MARK,
    SCHEMA_REASONS,
    TOO_MANY_FIELDS,
    BatchCounts,
)
from lakesink.pipeline.transforms import FAILED_INDEX, TRANSFORM_FAILED, Transforms
from lakesink.tables.rejected import dead_letter_rows

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

logger = logging.getLogger(__name__)

#: the error a guarded write raises for a row that needs a schema change
GUARD_MESSAGE = "lakesink: this batch needs a schema change or its dead letters staged first"

# schema -> (decoder, partitions, payload columns after the transforms) for that schema
Rebuild = Callable[[T.StructType], tuple[Decoder, PartitionSpec, T.StructType]]


class Marker:
    """The mark stage of one table, for its current schema."""

    def __init__(self, *, schema: T.StructType, policy: EvolutionPolicy, rebuild: Rebuild,
                 source_columns: SourceColumns | None = None,
                 transforms: Transforms | None = None) -> None:
        self.policy = policy
        self.rebuild = rebuild
        self.source_columns = source_columns or SourceColumns()
        self.transforms = transforms or Transforms([])
        self.use(schema)

    def use(self, schema: T.StructType) -> None:
        """Mark with ``schema`` from now on (at start and after an evolution)."""
        self.schema = schema
        self.decoder, self.partitions, self.columns = self.rebuild(schema)
        # Column expressions built once per schema and reused by every batch: they name
        # columns, so they do not depend on the batch's DataFrame, and building them
        # anew (hundreds of py4j calls) cost ~0.6 s of driver time per batch
        self._exprs: dict[Any, Any] = {}

    def memo(self, key: Any, build: Callable[[], Any]) -> Any:  # noqa: ANN401
        """``build()`` once per schema under ``key``."""
        if key not in self._exprs:
            self._exprs[key] = build()
        return self._exprs[key]

    @property
    def record(self) -> str:
        """The column table rows come from: the decoded record, one of an exploding
        decoder's rows, or either after the transforms."""
        if self.transforms:
            return MARK.transformed
        return MARK.exploded if self.decoder.explodes else MARK.record

    # -- the marked frame ----------------------------------------------------------------

    def mark(self, df: DataFrame) -> DataFrame:
        """Raw columns, the parsed record, the transformed record (with transforms), its
        UTC timestamp (when a timestamp column is configured), the unknown keys (every
        policy needs them: to add, report or reject) and the rejection marker."""
        plan = self.memo(("marked", "headers" in df.columns),
                         lambda: self._plan("headers" in df.columns))
        base = df.select(*plan.select).withColumn(MARK.extra, plan.extra)
        if plan.explode is not None:
            base = (base.withColumn(MARK.fail, plan.decode_fail)
                    .withColumn(MARK.exploded, plan.explode))
        if self.transforms:  # resolved against the batch's record type
            base = self.transforms.apply(
                base, MARK.exploded if plan.explode is not None else MARK.record,
                MARK.transformed)
        if plan.ts is not None:
            base = base.withColumn(MARK.ts, plan.ts)
        return base.withColumn(MARK.fail, plan.fail)

    def _plan(self, headers: bool) -> _MarkedPlan:
        """The expressions of :meth:`mark`, built once per schema."""
        fail_col = F.col(MARK.fail)
        select = [
            "key", "value", "topic", "partition", "offset",
            F.col("timestamp").alias("kafka_timestamp"), "timestampType",
            *(["headers"] if headers else []),
            self.decoder.parse(F.col("value")).alias(MARK.record),
        ]
        extra = self.decoder.unknown_keys(F.col("value"), F.col(MARK.record))
        fail = self.decoder.failure(F.col("value"), F.col(MARK.record), F.col(MARK.extra))
        decode_fail = explode = None
        if self.decoder.explodes:  # a good record -> its rows; a rejected one stays one row
            decode_fail = fail
            explode = F.explode(
                F.when(fail_col.isNull(), self.decoder.rows(F.col(MARK.record)))
                .otherwise(F.array(F.lit(None).cast(self.decoder.schema))))
            fail = fail_col
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
            fail = F.coalesce(fail, F.when(F.size(MARK.extra) > F.lit(self.room()),
                                           F.lit(TOO_MANY_FIELDS)))
        return _MarkedPlan(select, extra, decode_fail, explode, ts, fail)

    def room(self) -> int:
        """How many columns schema evolution may still add (``table.max_columns``); 0 for
        a table already at or over it (declared, inferred or resolved that wide)."""
        return max(0, self.policy.max_columns - len(self.schema.fields))

    def widenable(self) -> list[T.StructField]:
        if not self.policy.type_widening:
            return []
        return [f for f in self.schema.fields if widenable(f)]

    @property
    def resolves_ids(self) -> bool:
        """Whether the decoder looks records' schema ids up in a registry (records of
        an id new to the run are marked :data:`UNRESOLVED` until it has)."""
        return isinstance(self.decoder, RegistryDecoder)

    # -- counts ----------------------------------------------------------------------------

    def aggregates(self) -> list[Column]:
        """Records, rejected, records with unknown fields, widening candidates, unresolved
        schema ids (over a marked frame), aliased as :class:`~.marks.BatchCounts`."""
        return self.memo("aggregates", self._aggregates_plan)

    def _aggregates_plan(self) -> list[Column]:
        fail = F.col(MARK.fail)
        aggs = [F.count(F.lit(1)).alias("records"), F.count(fail).alias("rejected")]
        if self.policy.watches_unknown:
            aggs.append(F.count_if((F.size(MARK.extra) > 0) & fail.isNull())
                        .alias("unknown"))
        if self.widenable():
            aggs.append(F.count_if(fail == F.lit(SCHEMA_MISMATCH)).alias("mismatch"))
        if self.resolves_ids:
            aggs.append(F.count_if(fail == F.lit(UNRESOLVED)).alias("unresolved"))
        return aggs

    def observed(self, observation: Observation, marked: DataFrame) -> BatchCounts:
        """The counts an observation collected during a write; when Spark reports none
        (seen with tiny streaming batches) or ran no job (a Delta append skipped by its
        txn: a stale writer whose batch another committed), they are computed with one
        more pass — never a wait without end."""
        values = observation_values(observation)
        if "records" not in values:
            row = marked.agg(*self.aggregates()).first()
            values = row.asDict() if row is not None else {}
        return BatchCounts.of(values)

    def count(self, marked: DataFrame) -> BatchCounts:
        """:meth:`aggregates` in one pass over ``marked`` (which that pass caches)."""
        aggs = self.aggregates()
        # observed on a no-op write: one stage, no shuffle for the aggregate
        observation = Observation(f"lakesink_count_{time.monotonic_ns()}")
        marked.observe(observation, *aggs).write.format("noop").mode("overwrite").save()
        return BatchCounts.of(observation.get)

    # -- good rows and dead letters ----------------------------------------------------------

    def _guard(self) -> Column | None:
        """True for rows that would change the schema (an unknown field under
        add_columns; a mismatch when widening is allowed) and for rejected rows (their
        dead letters are staged before the commit)."""
        fail = F.col(MARK.fail)
        checks = [fail.isNotNull()]
        if self.policy.adds_columns:
            checks.append(fail.isNull() & (F.size(MARK.extra) > 0))
        if self.widenable():
            checks.append(fail == F.lit(SCHEMA_MISMATCH))
        return combine(operator.or_, checks) if checks else None

    def good(self, marked: DataFrame, *, guarded: bool = False) -> DataFrame:
        """The good rows as table columns. ``guarded``: a row that would change the
        schema, or is rejected, fails the job with :data:`GUARD_MESSAGE` (a write that is
        its commit then stops before it commits)."""
        keep, columns = self.memo(("good", guarded), lambda: self._good_plan(guarded))
        return marked.where(keep).select(*columns)

    def _good_plan(self, guarded: bool) -> tuple[Column, list[Column]]:
        ts = F.col(MARK.ts) if self.partitions.timestamp_column is not None else None
        keep = F.col(MARK.fail).isNull()
        guard = self._guard() if guarded else None
        if guard is not None:
            keep = F.when(guard, F.raise_error(F.lit(GUARD_MESSAGE))).otherwise(keep)
        return keep, [*self.partitions.output_columns(F.col(self.record), self.columns, ts),
                      *self.source_columns.columns()]

    def recount(self, df: DataFrame) -> Callable[[], int]:
        """An exact count of the batch's good rows (a Spark job over the raw rows),
        for a writer whose observed count disagrees with what it wrote."""
        return lambda: self.good(self.mark(df)).count()

    def dead_letters(self, marked: DataFrame, batch_id: int, app_id: str) -> DataFrame:
        """The dead-letter rows of ``marked`` (:func:`lakesink.tables.rejected.
        dead_letter_rows`), each with its reason, detail and stage (their expressions
        built once per schema: some thousand JVM calls, 0.4-0.5 s a batch before)."""
        reason, detail, stage = self.memo("dead_letters", self._dead_letter_plan)
        return dead_letter_rows(
            marked.where(F.col(MARK.fail).isNotNull()), reason=reason, detail=detail,
            stage=stage, kafka_timestamp=F.col("kafka_timestamp"), batch_id=batch_id,
            app_id=app_id)

    def _dead_letter_plan(self) -> tuple[Column, Column, Column]:
        """A dead letter's reason, detail and stage, as expressions over the marked
        frame."""
        fail = F.col(MARK.fail)
        reason, detail = self.decoder.explain(F.col("value"), F.col(MARK.record))
        ts_col = self.partitions.timestamp_column
        is_ts = fail == F.lit(INVALID_TIMESTAMP)
        ts_detail = F.concat(
            F.lit(f"{ts_col}: cannot read "),
            F.coalesce(F.col(self.record)[ts_col].cast("string"), F.lit("?")) if ts_col
            else F.lit("?"),
            F.lit(" as a timestamp (epoch s/ms/us/ns or ISO-8601)"),
        )
        folders = self.partitions.unfit_folders(F.col(self.record), self.columns)
        if folders is not None:  # the first check that failed names the reason
            is_folder = fail == F.lit(INVALID_PARTITION_VALUE)
            reason = F.when(is_folder, F.lit(INVALID_PARTITION_VALUE)).otherwise(reason)
            detail = F.when(is_folder, folders[1]).otherwise(detail)
        if self.policy.adds_columns:
            is_wide = fail == F.lit(TOO_MANY_FIELDS)
            reason = F.when(is_wide, F.lit(TOO_MANY_FIELDS)).otherwise(reason)
            detail = F.when(is_wide, F.concat(
                F.size(MARK.extra).cast("string"),
                F.lit(f" fields outside the schema ({len(self.schema.fields)} columns): "
                      f"more than table.max_columns ({self.policy.max_columns}) allows"))
            ).otherwise(detail)
        stage = (F.when(is_ts | reason.isin(*SCHEMA_REASONS), F.lit("schema"))
                 .otherwise(F.lit("decode")))
        if self.transforms:
            is_tf = fail == F.lit(TRANSFORM_FAILED)
            described = F.array(*[F.lit(self.transforms.describe(i) + " raised an error")
                                  for i in range(len(self.transforms.items))])
            tf_detail = F.element_at(described, F.col(FAILED_INDEX) + 1)
            reason = F.when(is_tf, F.lit(TRANSFORM_FAILED)).otherwise(reason)
            detail = F.when(is_tf, tf_detail).otherwise(detail)
            stage = F.when(is_tf, F.lit("transform")).otherwise(stage)
        return (F.when(is_ts, F.lit(INVALID_TIMESTAMP)).otherwise(reason),
                F.when(is_ts, ts_detail).otherwise(detail), stage)


@dataclass(frozen=True)
class _MarkedPlan:
    """Columns of :meth:`Marker.mark`, in the order they are added."""

    select: list[Any]  # raw columns and the parsed record
    extra: Column  # the unknown keys
    decode_fail: Column | None  # the mark before the explode (exploding decoders)
    explode: Column | None  # the exploded row (exploding decoders)
    ts: Column | None  # the timestamp (with a timestamp column)
    fail: Column  # the final mark


#: how long a finished write's observation may take to report (Spark completes it as
#: the action ends; a write that ran no job never reports)
OBSERVATION_WAIT_S = 5.0


def observation_values(observation: Observation, wait_s: float = OBSERVATION_WAIT_S
                       ) -> dict[str, Any]:
    """The observation's metrics, or ``{}`` if none came within ``wait_s``.
    ``Observation.get`` blocks until a job reports, with no timeout, and a py4j wait
    cannot be interrupted (not even by SIGTERM): the JVM object's future is polled
    instead."""
    jo = getattr(observation, "_jo", None)  # pyspark's handle of org.apache.spark.sql.Observation
    if jo is None:  # never attached to a frame
        return {}
    deadline = time.monotonic() + wait_s
    try:
        while not jo.future().isCompleted():
            if time.monotonic() >= deadline:
                logger.debug("observation %s: no metrics after %.0f s: counting again",
                             observation._name, wait_s)
                return {}
            time.sleep(0.005)
        return observation.get
    except Exception as exc:  # noqa: BLE001 - py4j surfaces Spark's assertion
        logger.debug("observation unavailable (%s): counting again", type(exc).__name__)
        return {}
