"""Delta Lake tables (delta-spark), exactly once through Delta's own transaction ids.

Each batch ``b`` is one append whose commit carries ``SetTransaction(appId, b)``
(``txnAppId``/``txnVersion``): Delta ignores an append whose version is not newer than
the recorded one, atomically with the data. The app id is the checkpoint's
(:mod:`lakesink.tables.identity`), so a new checkpoint, whose batch ids restart at 0,
is never mistaken for the old one.

The recorded version is read from the Delta log once, at the first batch (computing a
snapshot's transactions reconstructs the table state: seconds, not milliseconds), and
then tracked in memory: this process is the only writer with this app id (one app id
per checkpoint, one query per checkpoint). A committed batch is reported as skipped
without running a Spark job. The table is created by the first
append, with the configured partition columns; an existing Delta table's partition
columns are checked at start.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import TYPE_CHECKING, Any


from lakesink.errors import CommitMismatch, LayoutError, one_line
from lakesink.faults import fault_point
from lakesink.tables.base import (
    BatchResult,
    CommitInfo,
    Recount,
    TableWriter,
    compare_layout,
)
from lakesink.tables.delta_create import (
    build_table,
    builder_usable,
    create_by_delta_rs,
    spark_table_defaults,
)
from lakesink.tables.delta_files import DeltaFiles
from lakesink.tables.fs import join
from lakesink.tables.layout import TableLayout

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import types as T

    from lakesink.tables.fs import HadoopFS

logger = logging.getLogger(__name__)

#: a log checkpoint every N commits unless configured: delta-spark's default
CHECKPOINT_INTERVAL = 10
#: in the table's lakesink folder, ``<this>/<app id>.json``: written (create-if-absent)
#: once the table holds a batch of that app id (its ``SetTransaction``); a table found
#: later with the mark and without that app id's transaction lost its ``_delta_log``
COMMITTED_MARKS = "delta_committed"


def has_commit(fs: HadoopFS, table: str) -> bool:
    """Whether the Delta table at ``table`` has a commit. A ``_delta_log`` folder alone
    is not enough: a kill during the very first append can leave it empty (or holding
    only ``_staged_commits/``), and such a folder is not a Delta table yet."""
    return any(f.relative.endswith((".json", ".parquet"))
               for f in fs.list_files(join(table, "_delta_log")))


def committed_mark(layout: TableLayout, app_id: str) -> str:
    """The app id's mark in the table's lakesink folder (see :data:`COMMITTED_MARKS`)."""
    return join(layout.meta, COMMITTED_MARKS, f"{app_id}.json")


def mark_committed(fs: HadoopFS, layout: TableLayout, app_id: str) -> None:
    """Record (once per app id) that the table holds a batch of this app id: right
    after its first commit, and at a start that finds one. One ``exists`` before the
    create: a start with the mark in place (the common case) makes no failed
    conditional create."""
    mark = committed_mark(layout, app_id)
    if not fs.exists(mark):
        fs.write_once(mark, json.dumps({"table": layout.table, "app_id": app_id}))


def check_log(fs: HadoopFS, layout: TableLayout, app_id: str, key: str, *,
              has_commit: bool) -> None:
    """A table without a batch of ``app_id`` (no commit at all: ``has_commit`` False; or
    commits, none with its transaction) that this app id committed to before (its
    mark) lost its ``_delta_log``: deleted or moved, and perhaps made afresh since by
    another writer (a ``dlq replay``, another checkpoint). The next commit would go on
    without the rows it held while the checkpoint reads on past their records. The
    start stops instead (exit 2, naming ``key``), saying what to do. A new checkpoint
    (another app id) starts from its start settings: not refused. Not noticed: a log
    lost between the first commit and the mark, or under a running writer."""
    mark = committed_mark(layout, app_id)
    if not fs.exists(mark):
        return
    now = ("has no Delta commit" if not has_commit else
           f"has Delta commits, none of this checkpoint (app id {app_id})")
    raise LayoutError(
        key, f"{layout.table} {now}, but this checkpoint (app id {app_id}) committed to "
        "it before: its _delta_log was deleted or moved (and the table made again "
        "since, if it has commits), and the checkpoint would read on past the records "
        "of the rows it held",
        fix=f"restore the _delta_log to keep them; or, to go on without them, delete "
        f"{mark}")


class DeltaTableWriter(DeltaFiles, TableWriter):
    format = "delta"

    """Spark's Delta writer (the module's docstring); the Arrow path's file commit by
    delta-rs comes from :class:`~lakesink.tables.delta_files.DeltaFiles`."""

    def __init__(self, spark: SparkSession, layout: TableLayout, *,
                 checkpoint_interval: int | None = None, merge_schema: bool = True,
                 type_widening: bool = False,
                 task_filesystem: tuple[str, dict[str, Any]] | str =
                 "no filesystem for the tasks", arrow_records: bool = True,
                 config_key: str = "table.name", **kwargs: Any) -> None:
        """``task_filesystem``: where the Arrow tasks write the table's files and how
        (:func:`~lakesink.runtime.storage.delta_task_filesystem`), or why they do not;
        ``arrow_records``: the records are expected to take the Arrow path
        (:class:`~lakesink.tables.formats.WriterOptions`); ``config_key``: the key a
        refusal of the table names (:func:`check_log`)."""
        super().__init__(spark, layout, **kwargs)
        self.config_key = config_key
        self.checkpoint_interval = checkpoint_interval
        self.merge_schema = merge_schema
        self.type_widening = type_widening
        self.task_filesystem = task_filesystem
        #: delta-rs makes the table and answers the start's questions (see log_view)
        self.delta_rs_reads = arrow_records and not isinstance(task_filesystem, str)
        self._committed: int | None = None
        self._committed_known = False
        self._has_commits = False
        self._marked = False  # this app id's mark is in place (see mark_committed)
        self._table: Any = None  # delta-rs's handle, for commit_files
        #: delta-rs refused a commit (why, when): Spark's writer for REFUSAL_HOLD_S
        self._refused: tuple[str, float] | None = None

    @property
    def exists(self) -> bool:
        """Whether the table has a commit (see :func:`has_commit`)."""
        return has_commit(self.fs, self.layout.table)

    def log_view(self) -> Any:  # noqa: ANN401
        """delta-rs's up-to-date view of the table's log, for the start's and the
        commits' questions (partition columns, properties, this app id's batch, the
        version): no JVM class of Delta's is loaded, no table state rebuilt by a Spark
        job. None for a table Spark's writer is expected to write (``delta_rs_reads``:
        its batches would load Delta's classes anyway, and delta-rs' table state would
        be a second copy in the driver), and where delta-rs cannot open the table (a
        protocol it does not read): then Delta's own log (``_snapshot``)."""
        if not self.delta_rs_reads:
            return None
        try:
            return self._delta_rs()
        except Exception as exc:  # noqa: BLE001 - Delta's own log answers instead
            logger.info("%s: delta-rs cannot read the Delta log (%s); Delta's own reader "
                        "answers", self.layout.table, one_line(exc, name=False))
            return None

    def _snapshot(self) -> Any:
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
            self.spark._jsparkSession, self.layout.table
        )
        return log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())

    def partition_columns(self) -> list[str]:
        """From the log's metadata (not ``DESCRIBE DETAIL delta.`…```: a path table in
        SQL is resolved through the session catalog, which with a Hive catalog asks the
        metastore, and a metastore that is down must not stop ingestion)."""
        view = self.log_view()
        if view is not None:
            return [str(c) for c in view.metadata().partition_columns]
        columns = self._snapshot().metadata().partitionColumns()
        return [str(columns.apply(i)) for i in range(columns.size())]

    def _property(self, key: str) -> str | None:
        view = self.log_view()
        if view is not None:
            return (view.metadata().configuration or {}).get(key)
        value = self._snapshot().metadata().configuration().get(key)
        return str(value.get()) if value.isDefined() else None

    def committed_version(self) -> int | None:
        """The newest batch id this app id committed to the (existing) table, if any."""
        view = self.log_view()
        if view is not None:
            found = view.transaction_version(self.app_id)
            return None if found is None else int(found)
        recorded = self._snapshot().transactions().get(self.app_id)
        return int(recorded.get()) if recorded.isDefined() else None

    def _known_committed(self) -> int | None:
        if not self._committed_known:
            self._committed = self.committed_version() if self.exists else None
            self._committed_known = True
        return self._committed

    def is_committed(self, batch_id: int) -> bool:
        committed = self._known_committed()
        return committed is not None and committed >= batch_id

    def other_writers(self) -> dict[str, int]:
        if not self.exists or self._known_committed() is not None:
            return {}
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        txns = jvm.scala.jdk.javaapi.CollectionConverters.asJava(
            self._snapshot().transactions())
        return {str(k): int(txns.get(k)) for k in txns.keySet() if str(k) != self.app_id}

    def prepare(self) -> None:
        """Check an existing table (its partition columns; a log that is gone, see
        :func:`check_log`), then :meth:`TableWriter.prepare` and the staging sweep."""
        exists = self.exists
        if exists:  # a Delta table's own metadata is the authority on its partitions
            compare_layout({"format": "delta", "partition_by": self.partition_columns()},
                           "delta", self.partition_by, table=self.layout.table)
            if self.type_widening and self._property("delta.enableTypeWidening") != "true":
                # a table made without it (SQL: once in the table's life)
                self.spark.sql(f"ALTER TABLE delta.`{self.layout.table}` SET TBLPROPERTIES "
                               "('delta.enableTypeWidening' = 'true')")
        super().prepare()  # the lease: what follows reads the log as its holder
        try:
            self._committed_known = False  # not a view from before the lease
            exists = self.exists
            if exists and self._known_committed() is not None:
                self.mark_committed()
            else:  # no batch of this app id: was there one before?
                check_log(self.fs, self.layout, self.app_id, self.config_key,
                          has_commit=exists)
        except BaseException:
            self.close()  # a refused start holds no lease
            raise
        self.sweep_staging()

    def mark_committed(self) -> None:
        """:func:`mark_committed` for this writer's table and app id, once per writer
        (after each commit: the first one writes it)."""
        if not self._marked:
            mark_committed(self.fs, self.layout, self.app_id)
            self._marked = True

    def write_batch(
        self, batch_id: int, df: DataFrame, *, commit_info: CommitInfo | None = None,
        recount: Recount | None = None,
    ) -> BatchResult:
        committed = self._known_committed()
        exists = committed is not None or self.exists
        if committed is not None and committed >= batch_id:
            logger.info("batch %d already committed to Delta (txn %d): skipped", batch_id,
                        committed)
            self.mark_committed()  # a batch of this app id is in the log
            return BatchResult(batch_id, skipped=True)
        attempt = uuid.uuid4().hex
        before = self._version()
        writer = (self._spark_writer(self.shuffled(df), exists)
                  .option("txnAppId", self.app_id).option("txnVersion", str(batch_id))
                  # in the commit's commitInfo, as the delta-rs path's custom metadata:
                  # a take-over finds lakesink's commits by it (lakesink.kdi); the
                  # attempt tells this append's commit from another writer's of the batch
                  .option("userMetadata", json.dumps({"lakesink.app_id": self.app_id,
                                                      "lakesink.batch_id": batch_id,
                                                      "lakesink.attempt": attempt})))
        self.fence()
        try:
            writer.save(self.layout.table)
            fault_point("raise_after_delta_commit", batch_id)
        except BaseException:
            # the commit may have landed before the error (a failed post-commit hook, a
            # lost response): then the next attempt must skip the batch, not write it
            # again — Delta would drop the append by its txn and run no job at all, and
            # the batch's observation would wait forever. So the next attempt reads the
            # table's transactions again (other commits may have come after ours).
            self._committed_known = False
            raise
        self._committed = batch_id
        fault_point("after_delta_commit", batch_id)
        self.mark_committed()
        if not self._committed_by(attempt, before):
            # Delta skipped the append by its txn, without a job: the batch was committed
            # meanwhile — by a writer that took the table over while this one was frozen
            # (the proof fails: this writer stops, LeaseLost), or by a delta-rs put this
            # writer had given up on and that landed (its own: a replay, no count to
            # wait for)
            self.prove()
            logger.warning("batch %d was committed meanwhile by an earlier attempt of "
                           "this writer: not written again", batch_id)
            return BatchResult(batch_id, skipped=True)
        info = commit_info() if commit_info else {}
        metrics = self._commit_metrics(batch_id)
        files, size = metrics.get("numFiles", 0), metrics.get("numOutputBytes", 0)
        added = metrics.get("numOutputRows")
        if "written" in info and metrics and added != info["written"] and recount is not None:
            exact = recount()
            if exact == added:
                logger.warning("batch %d: the observed count (%d written) was off; an exact "
                               "count agrees with the %d committed row(s)", batch_id,
                               info["written"], exact)
                info["written"] = exact
        if "written" in info and metrics and added != info["written"]:
            raise CommitMismatch(
                f"batch {batch_id} of {self.layout.table}: {info['written']} row(s) counted "
                f"as written but Delta's commit added {metrics.get('numOutputRows')}. This is "
                "a lakesink bug: please report it with this message")
        self.measured(int(info.get("written", 0)), size)
        return BatchResult(batch_id, files=files, bytes=size, info=info)

    def _spark_writer(self, df: DataFrame, exists: bool) -> Any:
        """Spark's Delta append of ``df`` (options, partitions; table properties for a
        table it creates)."""
        writer = df.write.format("delta").mode("append").options(**self.write_options())
        if self.merge_schema:
            writer = writer.option("mergeSchema", "true")
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        if not exists:  # written down: delta-rs, which also commits, defaults to 100
            writer = writer.option("delta.checkpointInterval",
                                   str(self.checkpoint_interval or CHECKPOINT_INTERVAL))
            if self.type_widening:
                writer = writer.option("delta.enableTypeWidening", "true")
        return writer

    def create_table(self, schema: T.StructType) -> bool:
        """Commit a new table's protocol and metadata with ``schema`` from the driver
        (no Spark job), as Spark's first append of that schema would: the columns made
        nullable as the append stores them, the partition columns, the table properties
        :meth:`_spark_writer` gives a table it creates. By delta-rs where it can
        (:func:`~lakesink.tables.delta_create.create_by_delta_rs`: no JVM class of
        Delta's loaded), else by Delta's table builder (type widening; the session's
        defaults for new tables' properties, which delta-rs would not apply). False when neither can (a session whose ``spark_catalog`` is not
        Delta's, an error): the caller then appends zero rows with Spark's writer."""
        properties = {"delta.checkpointInterval":
                      str(self.checkpoint_interval or CHECKPOINT_INTERVAL)}
        if self.type_widening:
            properties["delta.enableTypeWidening"] = "true"
        elif self.delta_rs_reads and not spark_table_defaults(self.spark):
            try:
                table = create_by_delta_rs(self.task_filesystem, self.layout.table,
                                           schema.json(), self.partition_by, properties)
            except Exception as exc:  # noqa: BLE001 - made meanwhile, or the builder makes it
                if self.exists:
                    logger.info("%s: the Delta table was made meanwhile by another "
                                "writer", self.layout.table)
                    return True
                logger.info("%s: delta-rs did not make the Delta table (%s)",
                            self.layout.table, one_line(exc, name=False))
            else:
                if table is not None:
                    self._table = table  # its log view, for the commits
                    return True
        if not builder_usable(self.spark):
            return False
        try:
            build_table(self.spark, self.layout.table, schema.json(), self.partition_by,
                        properties)
        except Exception as exc:  # noqa: BLE001 - Spark's writer creates it instead
            logger.info("%s: the Delta table is not created from the driver (%s)",
                        self.layout.table, one_line(exc, name=False))
            return False
        return True

    def _version(self, *, fresh: bool = False) -> int:
        """The table's newest log version as the driver knows it (``fresh``: as the
        log says now; -1: no table yet)."""
        if fresh:
            view = self.log_view()
            return int((view if view is not None else self._snapshot()).version())
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
            self.spark._jsparkSession, self.layout.table)
        return int(log.unsafeVolatileSnapshot().version())

    def _entry(self, version: int) -> list[dict[str, Any]]:
        text = self.fs.read_text(join(self.layout.table, "_delta_log", f"{version:020d}.json"))
        return [json.loads(line) for line in (text or "").splitlines() if line]

    def _newest_commit(self) -> list[dict[str, Any]]:
        """The actions of the table's newest log entry (one small file read, not a
        Spark job)."""
        return self._entry(self._version())

    def _committed_by(self, attempt: str, before: int) -> bool:
        """Whether a log entry after ``before`` is the append of ``attempt`` (newest
        first: usually the newest one; the log read again before a no)."""
        for fresh in (False, True):
            for version in range(self._version(fresh=fresh), before, -1):
                for action in self._entry(version):
                    meta = (action.get("commitInfo") or {}).get("userMetadata")
                    if meta and attempt in meta:
                        return True
        return False

    def _ours(self, actions: list[dict[str, Any]], batch_id: int) -> bool:
        return any(a["txn"].get("appId") == self.app_id and a["txn"].get("version") == batch_id
                   for a in actions if "txn" in a)

    def _commit_metrics(self, batch_id: int) -> dict[str, int]:
        """Operation metrics (files, bytes and rows added) of this batch's commit, read
        from its log entry."""
        actions = self._newest_commit()
        if not self._ours(actions, batch_id):
            return {}  # not our commit (cannot happen with one writer): no metrics
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        metrics = info.get("operationMetrics") or {}
        return {k: int(v) for k, v in metrics.items() if str(v).isdigit()}
