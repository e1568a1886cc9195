"""Dead letters: the rejected area summarized (``lakesink dlq show``) and replayed
(``lakesink dlq replay``) through the current configuration.

Replay contract — every dead letter is re-ingested at most once, and a replay that
crashes is finished by the next one, never doubled:

1. Replays have an app id of their own, created once and kept in
   ``.lakesink/<table>/dlq/replay.json``, and are numbered 0, 1, 2, …
2. Replay *N* first writes its plan ``dlq/replay-<N>.json``: the rejected units it
   takes (every unit no earlier plan took), state ``planned``. A unit is a file of a
   Parquet dead-letter table, or one batch (``<app id>:<batch id>``) of a Delta one.
3. It runs the rows of those files through the batch function of the current config as
   batch *N* of the replay app id. The table writer's exactly-once keying (Parquet
   manifest, Delta ``txn``) turns a second run of *N* into a no-op.
4. The plan's state becomes ``done``: its files count as replayed. A crash before this
   leaves a ``planned`` plan; the next replay resumes it (same files, same *N*).

5. One replay of a table runs at a time: it holds ``dlq/replay.lock`` (created only if
   absent, renewed while it runs); a second ``dlq replay`` is refused, naming the holder.

Records that fail again are rejected again, into a file of the replay's own run; they
are pending dead letters for a later replay, with the reason of their latest attempt.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import TYPE_CHECKING, Any

from lakesink.tables.fs import HadoopFS, join
from lakesink.tables.layout import TableLayout
from lakesink.tables.lease import WriterLease
from lakesink.tables.rejected import dead_letter_layout
from lakesink.tables.formats import table_format

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakesink.config.plan import TableSpec
    from lakesink.config.storage import StorageConfig
    from lakesink.table_parts import TableParts
    from lakesink.runtime.arrow_fs import ArrowFS

logger = logging.getLogger(__name__)

PLANNED, DONE = "planned", "done"
# the replay lock is renewed every third of this; a replay that died leaves it this long
# (or until a start on the same host sees its process gone)
REPLAY_LOCK_TTL_S = 60.0


class DeadLetters:
    """The dead letters of one table, in units (files or batches), and the replay plans
    over them."""

    def __init__(self, spark: SparkSession | None, fs: HadoopFS | ArrowFS,
                 layout: TableLayout, fmt: str = "parquet",
                 storage: StorageConfig | None = None) -> None:
        self.spark = spark  #: None: read only, without Spark (``fs`` an ArrowFS)
        self.storage = storage  #: to open a Delta table without Spark
        self.fs = fs
        self.layout = layout
        self.format = fmt
        #: the dead letters are a table with a log (Delta), else files per batch
        self.logged = table_format(fmt, key="dlq.format").has_log
        self.folder = join(layout.meta, "dlq")

    def _delta(self) -> DataFrame | None:
        table = dead_letter_layout(self.layout).table
        if not self.fs.exists(join(table, "_delta_log")):
            return None
        return self.spark.read.format("delta").load(table)

    def units(self) -> list[str]:
        if self.logged and self.spark is None:
            if not self.fs.exists(join(dead_letter_layout(self.layout).table, "_delta_log")):
                return []
            rows = self._dataset().to_table(columns=["app_id", "batch_id"]).group_by(
                ["app_id", "batch_id"]).aggregate([])
            return sorted(f"{a}:{b}" for a, b in zip(rows.column("app_id").to_pylist(),
                                                     rows.column("batch_id").to_pylist(),
                                                     strict=True))
        if self.logged:
            from pyspark.sql import functions as F

            df = self._delta()
            if df is None:
                return []
            return sorted(r[0] for r in df.select(F.concat_ws(":", "app_id", "batch_id"))
                          .distinct().collect())
        return [f.relative for f in self.fs.list_files(self.layout.rejected, suffix=".parquet")]

    def plans(self) -> list[dict[str, Any]]:
        found = [self.fs.read_json(f.path)
                 for f in self.fs.list_files(self.folder, suffix=".json")
                 if f.relative.startswith("replay-")]
        return sorted((p for p in found if p), key=lambda p: p["replay"])

    def replayed(self) -> set[str]:
        """Units replayed and still there (retention may have deleted some since)."""
        units = set(self.units())
        return {name for p in self.plans() if p["state"] == DONE for name in p["files"]
                if name in units}

    def in_replay(self) -> set[str]:
        """Units an unfinished replay plan holds: retention keeps them."""
        return {name for p in self.plans() if p["state"] == PLANNED for name in p["files"]}

    def lock(self) -> WriterLease:
        """The replay lock: one replay (or retention run) of the table at a time."""
        return WriterLease(self.fs, join(self.folder, "replay.lock"), app_id="dlq-replay",
                           ttl_s=REPLAY_LOCK_TTL_S, table=self.layout.table,
                           refusal="Two replays at once would each take the pending dead "
                           "letters and write them twice; retention must not delete what "
                           "a replay is planning.")

    def expire(self, older_than: dt.datetime) -> int:
        """:meth:`expire_locked` under the replay lock."""
        lock = self.lock()
        lock.acquire()
        try:
            return self.expire_locked(older_than)
        finally:
            lock.release()

    def expire_locked(self, older_than: dt.datetime) -> int:
        """Dead-letter retention: delete the dead letters rejected before
        ``older_than``, except those an unfinished replay holds. Parquet: whole files by
        their time (one file per batch); Delta: ``DELETE`` by ``rejected_at`` (VACUUM
        frees the files later). Returns the files deleted (Parquet) or rows (Delta)."""
        keep = self.in_replay()
        if self.logged:
            table = dead_letter_layout(self.layout).table
            if self._delta() is None:
                return 0
            # the session's time zone is UTC (lakesink sets it)
            when = older_than.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
            condition = f"rejected_at < TIMESTAMP '{when}'"
            if keep:
                held = ", ".join("'" + k.replace("'", "''") + "'" for k in sorted(keep))
                condition += f" AND concat_ws(':', app_id, batch_id) NOT IN ({held})"
            ident = "delta.`" + table.replace("`", "``") + "`"
            rows = self.spark.sql(f"DELETE FROM {ident} WHERE {condition}").collect()
            return int(rows[0][0]) if rows and rows[0][0] is not None else 0
        cutoff_ms = older_than.timestamp() * 1000
        deleted = 0
        for f in self.fs.list_files(self.layout.rejected, suffix=".parquet"):
            if f.relative not in keep and f.mtime_ms < cutoff_ms:
                deleted += bool(self.fs.delete(f.path, recursive=False))
        return deleted

    def pending(self) -> list[str]:
        taken = {name for p in self.plans() for name in p["files"]}
        return [u for u in self.units() if u not in taken]

    def replay_app_id(self) -> str:
        path = join(self.folder, "replay.json")
        data = self.fs.read_json(path)
        if data and data.get("app_id"):
            return str(data["app_id"])
        app_id = "dlq" + uuid.uuid4().hex[3:]
        self.fs.write_json(path, {"app_id": app_id,
                                  "created": dt.datetime.now(dt.UTC).isoformat()})
        return app_id

    def next_plan(self) -> dict[str, Any] | None:
        """The unfinished plan, else a new one over the pending files (None: nothing)."""
        plans = self.plans()
        if plans and plans[-1]["state"] == PLANNED:
            return plans[-1]
        pending = self.pending()
        if not pending:
            return None
        plan = {"replay": plans[-1]["replay"] + 1 if plans else 0, "state": PLANNED,
                "files": pending,
                "planned_at": dt.datetime.now(dt.UTC).isoformat()}
        self.save(plan)
        return plan

    def save(self, plan: dict[str, Any]) -> None:
        self.fs.write_json(join(self.folder, f"replay-{plan['replay']:06d}.json"), plan)

    def summary(self, names: list[str], sample: int
                ) -> tuple[int, dict[str, int], list[dict[str, Any]]]:
        """Of the dead letters of ``names`` (units): how many, how many by reason (most
        first), and the first ``sample`` by topic, partition and offset. Without Spark,
        DuckDB scans them (streaming: a big rejected area is not held in memory)."""
        columns = ["reason", "detail", "topic", "partition", "offset", "value"]
        if self.spark is not None:
            from pyspark.sql import functions as F

            df = self.read(names)
            counts = [(r["reason"], r["count"]) for r in
                      df.groupBy("reason").count().orderBy(F.desc("count")).collect()]
            first = [r.asDict() for r in df.orderBy("topic", "partition", "offset")
                     .select(*columns).limit(sample).collect()]
        else:
            import duckdb

            con = duckdb.connect()
            con.register("letters", self._dataset(names))
            where = ""
            if self.logged:
                import pyarrow as pa

                con.register("units", pa.table({"unit": names}))
                where = "WHERE concat(app_id, ':', batch_id) IN (SELECT unit FROM units)"
            counts = con.sql(f"SELECT reason, count(*) AS n FROM letters {where} "
                             "GROUP BY reason ORDER BY n DESC, reason").fetchall()
            quoted = ", ".join(f'"{c}"' for c in columns)
            got = con.sql(f"SELECT {quoted} FROM letters {where} "
                          f'ORDER BY topic, "partition", "offset" LIMIT {int(sample)}')
            first = [dict(zip(columns, r, strict=True)) for r in got.fetchall()]
        return sum(n for _, n in counts), dict(counts), first

    def _dataset(self, names: list[str] | None = None) -> Any:  # noqa: ANN401
        """Without Spark, as a pyarrow Dataset: the dead-letter table (Delta, by
        delta-rs, all of it), or the files ``names`` of a Parquet rejected area."""
        if not self.logged:
            return self.fs.dataset(  # type: ignore[union-attr]
                [join(self.layout.rejected, n) for n in names or []])
        from lakesink.runtime.lake import delta_table

        return delta_table(self.storage, dead_letter_layout(self.layout).table
                           ).to_pyarrow_dataset()

    def read(self, names: list[str]) -> DataFrame:
        if self.logged:
            from pyspark.sql import functions as F

            df = self._delta()
            assert df is not None
            return df.where(F.concat_ws(":", "app_id", "batch_id").isin(*names))
        return self.spark.read.parquet(*[join(self.layout.rejected, n) for n in names])


def show(spark: SparkSession | None, spec: TableSpec, *, sample: int = 5
         ) -> dict[str, Any] | None:
    """Pending dead letters by reason with a sample, and how many were replayed.
    ``spark`` None: read without Spark (pyarrow, delta-rs, DuckDB), or None on a store
    read only through Spark (see :func:`reader`)."""
    letters = reader(spark, spec)
    if letters is None:
        return None
    pending = letters.pending()
    replayed = letters.replayed()
    out: dict[str, Any] = {"table": spec.name, "path": letters.layout.table,
                           "format": spec.dlq.format, "pending_files": len(pending),
                           "replayed_files": len(replayed), "by_reason": {}, "sample": [],
                           "replayed_records": 0}
    if replayed:
        out["replayed_records"] = letters.summary(sorted(replayed), 0)[0]
    if not pending:
        return out
    _, out["by_reason"], first = letters.summary(pending, sample)
    out["sample"] = [
        {**{k: r[k] for k in ("reason", "detail", "topic", "partition", "offset")},
         "value": None if r["value"] is None else bytes(r["value"][:80]).decode("utf-8",
                                                                                 "replace")}
        for r in first]
    return out


def reader(spark: SparkSession | None, spec: TableSpec) -> DeadLetters | None:
    """``spec``'s dead letters to read: without Spark when ``spark`` is None (local disk
    and S3; None on another store: pass a session)."""
    layout = TableLayout.of(spec.table.base_path, spec.name)
    if spark is None:
        from lakesink.runtime.arrow_fs import ArrowFS

        fs = ArrowFS.open(spec.storage, layout.base)
        if fs is None:
            return None
        return DeadLetters(None, fs, layout, spec.dlq.format, storage=spec.storage)
    from lakesink.runtime import storage

    storage.apply(spark, spec.storage, [spec.table.base_path])
    return DeadLetters(spark, HadoopFS(spark, layout.base), layout, spec.dlq.format,
                       storage=spec.storage)


def replay(spark: SparkSession, spec: TableSpec) -> dict[str, Any]:
    """Re-ingest the pending dead letters once (see the module docstring); a second
    replay of the same table while one runs is refused (``SecondWriterError``)."""
    from lakesink.table_parts import TableParts
    from lakesink.runtime import storage

    storage.apply(spark, spec.storage, [spec.table.base_path])
    parts = TableParts.resolve(spec, spark)
    letters = DeadLetters(spark, parts.fs, parts.layout, spec.dlq.format)
    lock = letters.lock()
    lock.acquire()  # one replay at a time: both would plan the same pending letters
    try:
        return _replay_locked(spark, letters, parts)
    finally:
        lock.release()


def _replay_locked(spark: SparkSession, letters: DeadLetters, parts: TableParts
                   ) -> dict[str, Any]:
    from pyspark.sql import functions as F

    plan = letters.next_plan()
    if plan is None:
        return {"replayed_files": 0, "records": 0, "written": 0, "rejected": 0}
    processor = parts.processor(letters.replay_app_id())
    rows = letters.read(plan["files"]).select(
        "key", "value", "topic", "partition", "offset",
        F.col("kafka_timestamp").alias("timestamp"),
        F.lit(None).cast("int").alias("timestampType"))
    logger.info("dead-letter replay %d: %d file(s)", plan["replay"], len(plan["files"]))
    from lakesink.observe.progress import CatchUpProgress

    # one batch: the count arrives at its commit; the bar shows it running till then
    progress = CatchUpProgress(None, lambda: processor.stats.records,
                               finished="dead-letter replay").start()
    try:
        processor(rows, plan["replay"])
    finally:
        progress.finish()
        processor.close()
    stats = processor.stats
    plan.update(state=DONE, done_at=dt.datetime.now(dt.UTC).isoformat(),
                records=stats.records, written=stats.written, rejected=stats.rejected,
                resumed=bool(stats.skipped))
    letters.save(plan)
    return {"replay": plan["replay"], "replayed_files": len(plan["files"]),
            "records": stats.records, "written": stats.written, "rejected": stats.rejected,
            "resumed": bool(stats.skipped)}
