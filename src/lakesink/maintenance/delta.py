"""OPTIMIZE, VACUUM and repair of lakesink's Delta tables, through Delta itself.

* ``optimize``: delta-spark's bin-packing (``OPTIMIZE``), or Z-order by the columns of
  ``maintenance.zorder_by``, with ``table.target_file_size`` as the largest file. It
  commits like any writer, with Delta's conflict checks: it is safe beside a running
  ingestion (an append never conflicts with a compaction of files it did not touch),
  and the ingestion's ``txn`` keying (app id, batch id) is not touched.
* ``vacuum``: ``VACUUM`` with a retention in hours; less than Delta's safe minimum (7
  days) is refused unless forced, as Delta itself does.
* ``repair``: files the log references that are gone are reported and, when applied,
  removed from the table in one commit (delta-rs' ``FSCK``, like kafka-delta-ingest's
  ``repair``).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from lakesink.errors import ConfigError, SinkError
from lakesink.maintenance.base import Maintainer, table_commits

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

SAFE_RETENTION_HOURS = 168


@dataclass
class DeltaReport:
    table: str
    format: str = "delta"
    operation: str = ""
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    version_before: int | None = None
    version_after: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    applied: bool = False
    seconds: float = 0.0

    @property
    def problems(self) -> int:
        return len(self.missing)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "problems": self.problems}


def _ident(uri: str) -> str:
    return "delta.`" + uri.replace("`", "``") + "`"


def _detail(spark: SparkSession, uri: str) -> tuple[int, int, int]:
    """(files, bytes, version) of the table's current snapshot."""
    row = spark.sql(f"DESCRIBE DETAIL {_ident(uri)}").select("numFiles", "sizeInBytes").first()
    version = spark.sql(f"DESCRIBE HISTORY {_ident(uri)} LIMIT 1").select("version").first()
    return int(row[0] or 0), int(row[1] or 0), int(version[0])


def optimize(spark: SparkSession, uri: str, name: str, *, zorder_by: list[str],
             target_file_size: int | None, partition: tuple[str, str] | None = None
             ) -> DeltaReport:
    """``partition``: (column, value): only that partition's files (Delta allows
    partition columns only in OPTIMIZE's WHERE; another column is refused by Delta)."""
    started = time.monotonic()
    where = ""
    if partition is not None:
        column, value = partition
        if "${" in value:  # spark.sql would substitute it (spark.sql.variable.substitute)
            raise ConfigError("partition", f"{value!r}: a value with '${{' is not supported")
        where = (" WHERE `" + column.replace("`", "``") + "` = '"
                 + value.replace("\\", "\\\\").replace("'", "\\'") + "'")
    report = DeltaReport(name, operation="OPTIMIZE" + where + (
        " ZORDER BY " + ", ".join(zorder_by) if zorder_by else ""))
    report.files_before, report.bytes_before, report.version_before = _detail(spark, uri)
    if partition is not None:
        columns = spark.sql(f"DESCRIBE DETAIL {_ident(uri)}").first()["partitionColumns"]
        if partition[0].lower() not in {c.lower() for c in columns or []}:
            raise ConfigError("partition", f"{partition[0]!r} is not a partition column of "
                              f"{name} (its partition columns: "
                              f"{', '.join(columns or []) or 'none'})")
    key = "spark.databricks.delta.optimize.maxFileSize"
    previous = spark.conf.get(key, None)
    if target_file_size:
        spark.conf.set(key, str(target_file_size))
    try:
        zorder = (" ZORDER BY (" + ", ".join("`" + c.replace("`", "``") + "`"
                                              for c in zorder_by) + ")") if zorder_by else ""
        metrics = spark.sql(f"OPTIMIZE {_ident(uri)}{where}{zorder}"
                            ).select("metrics.*").first()
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)
    if metrics is not None:
        m = metrics.asDict(recursive=True)
        report.metrics = {k: m.get(k) for k in ("numFilesAdded", "numFilesRemoved",
                                                "totalConsideredFiles", "numBatches")}
    report.files_after, report.bytes_after, report.version_after = _detail(spark, uri)
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _exposed_to_vacuum(path: str) -> bool:
    """A log path (as the log spells it) that Delta-Spark's ``VACUUM`` does not match
    with the file it lists: a non-ASCII character percent-encoded in the log that Java's
    ``URI`` leaves raw (all but space and control characters), so the file sits in a
    folder named with the raw character — an earlier lakesink's delta-rs commit.
    lakesink now names such folders in ASCII (the log then spells ``%25C3``); Spark's
    writer spells ``ü`` raw and ``%C2%A0`` (a no-break space) encoded, as Java does."""
    import unicodedata
    from urllib.parse import unquote

    for run in re.findall(r"(?:%[89A-Fa-f][0-9A-Fa-f])+", path):
        for c in unquote(run, errors="replace"):
            if not (unicodedata.category(c) in ("Zs", "Zl", "Zp") or 0x7F <= ord(c) <= 0x9F):
                return True
    return False


def check_retention(retention_hours: float, *, force: bool) -> None:
    if retention_hours < SAFE_RETENTION_HOURS and not force:
        raise ConfigError(
            "maintenance.vacuum_retention_hours",
            f"{retention_hours:g} hours is less than Delta's safe minimum "
            f"({SAFE_RETENTION_HOURS} hours): a reader or a writer still on an older "
            "version could lose files it needs; pass --force to vacuum anyway")


def vacuum(spark: SparkSession, uri: str, name: str, *, retention_hours: float,
           force: bool = False, dry_run: bool = False) -> DeltaReport:
    check_retention(retention_hours, force=force)
    started = time.monotonic()
    report = DeltaReport(name, operation=f"VACUUM RETAIN {retention_hours:g} HOURS"
                         + (" DRY RUN" if dry_run else ""))
    report.files_before, report.bytes_before, report.version_before = _detail(spark, uri)
    key = "spark.databricks.delta.retentionDurationCheck.enabled"
    previous = spark.conf.get(key, None)
    if force:
        spark.conf.set(key, "false")
    try:
        if dry_run:
            rows = spark.sql(f"VACUUM {_ident(uri)} RETAIN {retention_hours:g} HOURS "
                             "DRY RUN").collect()
            report.metrics = {"files_to_delete": len(rows)}
        else:
            spark.sql(f"VACUUM {_ident(uri)} RETAIN {retention_hours:g} HOURS").collect()
            report.applied = True
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)
    report.files_after, report.bytes_after, report.version_after = _detail(spark, uri)
    report.seconds = round(time.monotonic() - started, 3)
    return report


def repair(table: Any, name: str, *, apply: bool) -> DeltaReport:  # noqa: ANN401
    """``table``: a delta-rs ``DeltaTable``."""
    started = time.monotonic()
    report = DeltaReport(name, operation="FSCK" + ("" if apply else " DRY RUN"))
    report.version_before = table.version()
    report.files_before = len(table.file_uris())
    result = table.repair(dry_run=not apply)
    report.missing = sorted(str(p) for p in result.get("files_removed", []))
    report.applied = apply and bool(report.missing)
    table.update_incremental()
    report.version_after = table.version()
    report.files_after = len(table.file_uris())
    report.seconds = round(time.monotonic() - started, 3)
    return report


class DeltaMaintainer(Maintainer):
    """Delta's own OPTIMIZE, VACUUM and FSCK (see the module's docstring); its commits
    under the table's writer lease where the table needs one."""

    def nothing_to_do(self, operation: str) -> dict[str, Any] | None:
        """A table with no commit yet (a stream that has not committed its first batch):
        said in one line instead of Delta's "not a Delta table" error."""
        if self.fs.list_files(self.layout.table + "/_delta_log", suffix=".json"):
            return None
        return {"table": self.layout.name, "format": "delta", "operation": operation,
                "nothing_to_do": "the table has no commit yet"}

    def files(self) -> list[dict[str, Any]]:
        """The log's files (delta-rs), as the table's current version holds them; each
        path as the store names the file (the log spells it percent-encoded)."""
        from urllib.parse import unquote

        return sorted(({"path": unquote(a["path"]), "rows": a["num_records"],
                        "bytes": a["size_bytes"]} for a in self._adds()),
                      key=lambda f: f["path"])

    def _adds(self) -> list[dict[str, Any]]:
        from lakesink.runtime.lake import delta_table

        if self.nothing_to_do("files") is not None:
            return []
        import pyarrow as pa

        # delta-rs 1.x answers with an arro3 table: pyarrow reads it by the C data interface
        return pa.table(delta_table(self.spec.storage, self.layout.table).get_add_actions(
            flatten=True)).select(["path", "num_records", "size_bytes"]).to_pylist()

    def _log_paths(self) -> list[str]:
        """The live files' paths as the log spells them; none where delta-rs cannot
        open the table the way the run does (HDFS, GCS, credential providers: lakesink
        never committed there through delta-rs, so nothing is exposed to VACUUM)."""
        from lakesink.runtime.storage import task_filesystem

        if isinstance(task_filesystem(self.spec.storage, self.layout.table), str):
            return []
        return [a["path"] for a in self._adds()]

    def without_spark(self, what: str, **options: Any) -> dict[str, Any] | None:  # noqa: ANN401
        """``repair`` without ``--apply`` (delta-rs reads the log and the store)."""
        return self.repair(apply=False) if what == "repair" and not options["apply"] \
            else None

    def _commits(self) -> Any:  # noqa: ANN401 - a context manager
        return table_commits(self.spec, self.fs, self.layout, "delta")

    def compact(self, *, partition: tuple[str, str] | None,
                target_file_size: int | None) -> dict[str, Any]:
        with self._commits():
            return optimize(self.spark, self.layout.table, self.layout.name,
                            zorder_by=self.spec.maintenance.zorder_by,
                            target_file_size=target_file_size
                            or self.spec.table.target_file_size,
                            partition=partition).as_dict()

    def vacuum(self, *, force: bool, dry_run: bool) -> dict[str, Any]:
        exposed = [p for p in self._log_paths() if _exposed_to_vacuum(p)]
        if exposed:
            raise SinkError(
                f"{self.layout.name}: {len(exposed)} live file(s) of the log sit in folders "
                f"named with non-ASCII characters by an earlier lakesink (first: "
                f"{exposed[0]}); Spark's VACUUM would take them for untracked files and "
                "delete them. Not vacuumed: see 'A Delta table's folders are named in "
                "ASCII' in docs/architecture.md")
        return vacuum(self.spark, self.layout.table, self.layout.name,  # no commit: no lease
                      retention_hours=self.spec.maintenance.vacuum_retention_hours,
                      force=force, dry_run=dry_run).as_dict()

    def repair(self, *, apply: bool) -> dict[str, Any]:
        import contextlib

        from lakesink.runtime.lake import delta_table

        with self._commits() if apply else contextlib.nullcontext():
            return repair(delta_table(self.spec.storage, self.layout.table), self.layout.name,
                          apply=apply).as_dict()
