"""The ``foreachBatch`` function: one micro-batch from raw records to a committed table.

Per batch, one stage after the other, with a typed value between them::

    batch(df, id) ─ committed? ─► replay: publish what the outbox holds, register
                  └► engine.write ─────────────────────────► WriteOutcome
                       mark (decode, transforms, time, checks)   (result, BatchCounts,
                       [evolve the schema, mark again]             commit info)
                       stage the dead letters (outbox)
                       commit (the table writer's protocol)
                     ─► publish the dead letters ─► register (catalog outbox) ─► stats

The stages live beside this module: :mod:`.marker` (the marked frame, its counts, good
rows and dead-letter rows; :mod:`.marks` spells its shape), :mod:`.evolver` (schema
evolution), and two engines — :mod:`.arrow_engine` (pyarrow in the tasks) and
:mod:`.spark_engine` (Spark's expressions and writers) — over :mod:`.write`'s values. The
Arrow engine is used where the table and schema allow it; what it cannot do it returns as
a :class:`~.write.Fallback`, which :meth:`BatchFunction._write` logs once and hands to the
Spark engine.

Exactly-once is the table writer's contract (:mod:`lakesink.tables.base`); this
function is deterministic for a given batch, which is what that contract needs. A
replayed batch's dead letters are never computed again (a replay under a changed
configuration could reject other records than the first run did): they were staged
before the commit, and what the crash left in the outbox is published.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pyspark.sql import types as T

from lakesink.decode.evolution import EvolutionPolicy
from lakesink.errors import ConfigError, one_line
from lakesink.observe.logs import log_context
from lakesink.observe.metrics import METRICS
from lakesink.observe.telemetry import batch_span, phase
from lakesink.pipeline.arrow_engine import ArrowEngine
from lakesink.pipeline.arrow_path import arrow_spec, time_settings_refusal
from lakesink.pipeline.arrow_task import TaskSpec
from lakesink.pipeline.columns import SourceColumns
from lakesink.pipeline.evolver import SchemaEvolver, SchemaStore
from lakesink.pipeline.marker import Marker, Rebuild
from lakesink.pipeline.spark_engine import SparkEngine
from lakesink.pipeline.transforms import Transforms
from lakesink.pipeline.write import BatchContext, WriteOutcome
from lakesink.tables.base import TableWriter
from lakesink.tables.rejected import RejectedWriter

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakesink.catalog.outbox import Registrar

logger = logging.getLogger(__name__)


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
    #: with a catalog: batches registered, committed batches still waiting at stop, and
    #: batches the catalog refused (set aside; the next start tries them again)
    registered: int | None = None
    unregistered: int | None = None
    refused_by_catalog: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


class Watch(Protocol):
    """Something a run keeps an eye on beside its batches (a Parquet table's compaction
    journal: :class:`lakesink.maintenance.watch.CompactionWatch`). ``poke`` must return
    at once: a batch never waits for it."""

    def poke(self) -> None: ...

    def close(self) -> None: ...


class BatchFunction:
    """One table's ``foreachBatch`` function (see the module's docstring)."""

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
        watch: Watch | None = None,
    ) -> None:
        """``registrar``: registers each committed batch in a catalog (after its commit
        and its dead letters; :mod:`lakesink.catalog.outbox`); ``engine``: ``spark`` (JVM
        row expressions), ``arrow`` (pyarrow in the tasks; refused at start for a table
        it cannot write) or ``auto`` (arrow where it can); ``task_filesystem``: where the
        Arrow tasks write (:func:`~lakesink.runtime.storage.task_filesystem`);
        ``watch``: poked after each committed batch (:mod:`lakesink.maintenance.watch`:
        it never makes a batch wait)."""
        self.engine = engine
        self.task_filesystem = task_filesystem
        self.arrow: TaskSpec | None = None  #: the Arrow engine's spec, when it is used
        self.writer = writer
        self.rejected = rejected
        rejected.guard = writer.prove  # the outbox is the table's: the same lease
        self.registrar = registrar
        self.watch = watch
        self.app_id = app_id
        self.stats = RunStats()
        self._span: Any = None  # the running batch's trace span (with OpenTelemetry)
        self.marker = Marker(schema=schema, policy=policy, rebuild=rebuild,
                             source_columns=source_columns, transforms=transforms)
        self.evolver = SchemaEvolver(self.marker, writer.spark, store_schema, self._use)
        ctx = BatchContext(self.marker, self.evolver, writer, rejected, app_id)
        self.spark_engine = SparkEngine(ctx)
        self.arrow_engine = ArrowEngine(ctx, lambda: self.arrow)
        if self.engine != "spark":
            self._choose_engine()

    def _use(self, schema: T.StructType, changes: int) -> None:
        """Mark with ``schema`` from now on (after an evolution: ``changes`` made it)."""
        self.marker.use(schema)
        self.stats.schema_changes += changes
        if self.engine != "spark":
            self._choose_engine()

    def _choose_engine(self) -> None:
        """Use the Arrow engine when this table and schema allow it (see
        :func:`~lakesink.pipeline.arrow_path.arrow_spec`)."""
        m = self.marker
        spec = arrow_spec(decoder=m.decoder, transforms=m.transforms, writer=self.writer,
                          schema=m.schema, partitions=m.partitions,
                          source_columns=m.source_columns, filesystem=self.task_filesystem,
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

    def make_table(self, records: DataFrame) -> None:
        """Before the query starts: a new table the Arrow path commits into is made now,
        from the driver, with the columns the stream's ``records`` give (so the first
        batch does not make it with a Spark job, behind the workers' warm-up). Only
        an optimisation: what cannot be done here, the first batch does."""
        if self.arrow is None:
            return
        marker = self.marker
        try:
            self.writer.ensure_table(lambda: marker.good(marker.mark(records)), at_start=True)
        except Exception as exc:  # noqa: BLE001 - the first batch makes the table instead
            logger.info("%s: the table is made by the first batch (%s)",
                        self.writer.layout.table, one_line(exc, name=False))

    # -- one batch -----------------------------------------------------------------------

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
        with phase("write", self.writer.layout.name):
            outcome = self._write(df, batch_id)
        if outcome.marked is not None:
            outcome.marked.unpersist()
        result, counts, info = outcome.result, outcome.counts, outcome.info
        if result.skipped:  # committed meanwhile (cannot happen with one writer)
            self._replayed(batch_id, started)
            return
        reasons = (self.rejected.reasons(batch_id)
                   if counts.rejected and METRICS.by_reason else {})
        if counts.rejected:  # staged before the commit; published now
            with phase("dead_letters", self.writer.layout.name):
                self.rejected.publish(batch_id)
            # bad input is the dead-letter table's everyday work, not a warning of
            # lakesink's: counted in the metrics and the run summary
            logger.info("batch %d: %d record(s) rejected -> %s", batch_id,
                        counts.rejected, self.rejected.path(batch_id))
        self._register(batch_id)
        if self.watch is not None:
            self.watch.poke()
        stats = self.stats
        stats.batches += 1
        stats.seconds += time.monotonic() - started
        stats.records += counts.records
        stats.written += info["written"]
        stats.rejected += counts.rejected
        stats.unknown_dropped += counts.unknown
        stats.files += result.files
        stats.bytes += result.bytes
        if self._span is not None:
            self._span.set_attributes({
                "lakesink.records": counts.records, "lakesink.written": info["written"],
                "lakesink.rejected": counts.rejected, "lakesink.files": result.files,
                "lakesink.bytes": result.bytes})
        METRICS.committed(
            self.writer.layout.name, records=counts.records, written=info["written"],
            rejected=reasons, unknown_dropped=counts.unknown, files=result.files,
            size=result.bytes, seconds=time.monotonic() - started,
            schema_changes=stats.schema_changes - changes_before,
            pending=len(self.registrar.pending) if self.registrar is not None else None,
            batch_id=batch_id)
        logger.info("batch %d: committed in %.2fs (%d written, %d rejected, %d file(s))",
                    batch_id, time.monotonic() - started, info["written"], counts.rejected,
                    result.files)

    def _write(self, df: DataFrame, batch_id: int) -> WriteOutcome:
        """The write stage: the Arrow engine where it is used, else (or when it falls
        back: logged here, once) the Spark engine."""
        if self.arrow is not None:
            outcome = self.arrow_engine.write(df, batch_id)
            if isinstance(outcome, WriteOutcome):
                return outcome
            if outcome.message:
                logger.log(outcome.level, outcome.message, *outcome.args)
        return self.spark_engine.write(df, batch_id)

    def _register(self, batch_id: int) -> None:
        """The committed batch goes to the catalog (or waits in the outbox)."""
        if self.registrar is not None:
            with phase("catalog", self.writer.layout.name):
                self.registrar.committed(batch_id)

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

    def close(self) -> None:
        try:
            if self.registrar is not None:
                self.registrar.close()
                self.stats.registered = self.registrar.registered
                self.stats.unregistered = len(self.registrar.pending)
                self.stats.refused_by_catalog = self.registrar.refused
        finally:
            if self.watch is not None:
                self.watch.close()
            self.writer.close()
            self.rejected.close()
