"""Table maintenance: ``lakesink compact``, ``vacuum`` and ``repair`` for every table of
a config (``docs/maintenance.md``). Parquet: :mod:`lakesink.maintenance.parquet`
(lakesink's own journal); Delta: :mod:`lakesink.maintenance.delta` (Delta's own
commands). Each returns one report per table, a dict with what it did."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lakesink.errors import ConfigError
from lakesink.tables.formats import table_format

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.config.models import LakesinkConfig

#: default "small" without a target file size: Parquet files below it are merged
DEFAULT_SMALL = 64 * 1024 * 1024


def _parts(cfg: LakesinkConfig, spark: SparkSession) -> tuple[Any, Any]:
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout

    layout = TableLayout.of(cfg.table.base_path, cfg.table_name)
    return HadoopFS(spark, layout.base), layout


@contextlib.contextmanager
def delta_commits(cfg: LakesinkConfig, spark: SparkSession, fmt: str | None = None
                  ) -> Iterator[None]:
    """Around a maintenance command's Delta commits: the whole-table writer lease when
    the table needs one (Delta on S3 with the single-driver log store, where two
    drivers committing at once lose a commit): refused while a stream writes there."""
    from lakesink.runtime.storage import lease_options
    from lakesink.tables.lease import WriterLease

    options = lease_options(cfg, fmt)
    if not options["lease_per_table"]:
        yield
        return
    fs, layout = _parts(cfg, spark)
    if fmt is not None and fmt != cfg.table.format:  # the dead-letter table's
        from lakesink.tables.rejected import dead_letter_layout

        layout = dead_letter_layout(layout)
    lease = WriterLease(fs, layout.lease(None), app_id="lakesink-maintenance",
                        ttl_s=options["lease_s"], table=layout.table)
    lease.acquire()
    try:
        yield
    finally:
        lease.release()


def _not_started(cfg: LakesinkConfig, fs: Any, layout: Any, what: str  # noqa: ANN401
                 ) -> dict[str, Any] | None:
    """The report of a command on a table with a log but no commit yet (a stream that
    has not committed its first batch, or a table never written): nothing to do, said
    in one line instead of the format's "not a table" error."""
    if not table_format(cfg.table.format).has_log:
        return None  # a Parquet table without a manifest is an empty table
    if fs.list_files(layout.table + "/_delta_log", suffix=".json"):
        return None
    return {"table": layout.name, "format": cfg.table.format, "operation": what,
            "nothing_to_do": "the table has no commit yet"}


def compact(cfg: LakesinkConfig, spark: SparkSession, *,
            partition: tuple[str, str] | None = None,
            target_file_size: int | None = None) -> dict[str, Any]:
    """Merge the small files of the table ``cfg`` names (a route's: its route config).
    Delta only: ``partition`` (column, value) limits it to one partition;
    ``target_file_size`` overrides ``table.target_file_size``."""
    m = cfg.maintenance
    fs, layout = _parts(cfg, spark)
    if (empty := _not_started(cfg, fs, layout, "OPTIMIZE")) is not None:
        return empty
    if table_format(cfg.table.format).has_log:  # the format's own OPTIMIZE
        from lakesink.maintenance import delta

        with delta_commits(cfg, spark):
            return delta.optimize(spark, layout.table, layout.name, zorder_by=m.zorder_by,
                                  target_file_size=target_file_size
                                  or cfg.table.target_file_size,
                                  partition=partition).as_dict()
    if partition is not None:
        raise ConfigError("partition", "compacting one partition is for Delta tables")
    if cfg.catalog.type in ("iceberg", "quix"):
        raise ConfigError("catalog.type", f"compacting a Parquet table registered in a "
                          f"{cfg.catalog.type} catalog is not supported yet: the catalog "
                          "lists the files compaction replaces (a Hive catalog, which "
                          "lists folders, is fine)")
    return _compactor(cfg, spark).run().as_dict()


def _compactor(cfg: LakesinkConfig, spark: SparkSession) -> Any:  # noqa: ANN401
    from lakesink.maintenance.parquet import ParquetCompactor

    m = cfg.maintenance
    fs, layout = _parts(cfg, spark)
    target = int(cfg.table.target_file_size or 2 * DEFAULT_SMALL)
    small = int(m.small_file_size or (cfg.table.target_file_size or 2 * DEFAULT_SMALL) // 2)
    return ParquetCompactor(spark, fs, layout, small=small, target=target,
                            min_age_s=m.min_age_s, compression=cfg.table.compression)


def vacuum(cfg: LakesinkConfig, spark: SparkSession, *, force: bool = False,
           dry_run: bool = False) -> dict[str, Any]:
    """The table's vacuum, then the dead letters' retention (``dlq.retention_days``) and,
    for a Delta dead-letter table, its own VACUUM (the same retention and ``force``):
    the files of expired dead letters are deleted ``maintenance.vacuum_retention_hours``
    after their expiry."""
    m = cfg.maintenance
    fs, layout = _parts(cfg, spark)
    if (empty := _not_started(cfg, fs, layout, "VACUUM")) is not None:
        report = empty
    elif table_format(cfg.table.format).has_log:  # the format's own VACUUM
        from lakesink.maintenance import delta

        report = delta.vacuum(spark, layout.table, layout.name,  # no commit: no lease
                              retention_hours=m.vacuum_retention_hours, force=force,
                              dry_run=dry_run).as_dict()
    else:
        from lakesink.maintenance.parquet import CompactReport, vacuum_replaced

        if not dry_run:
            _compactor(cfg, spark).resume_locked(CompactReport(layout.name))
        report = vacuum_replaced(fs, layout, 0 if force else m.replaced_grace_s,
                                 dry_run=dry_run).as_dict()
    if cfg.dlq.retention_days is not None and not dry_run:
        import datetime as dt

        from lakesink.dlq import DeadLetters

        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=cfg.dlq.retention_days)
        with delta_commits(cfg, spark, cfg.dlq.format):
            expired = DeadLetters(spark, fs, layout, cfg.dlq.format).expire(cutoff)
        report["dead_letters_expired"] = {
            "before": cutoff.isoformat(timespec="seconds"),
            ("rows" if table_format(cfg.dlq.format).has_log else "files"): expired}
    if table_format(cfg.dlq.format).has_log:  # its DELETEs free no file until a VACUUM
        from lakesink.maintenance import delta
        from lakesink.tables.rejected import dead_letter_layout

        letters = dead_letter_layout(layout)
        if fs.list_files(letters.table + "/_delta_log", suffix=".json"):
            done = delta.vacuum(spark, letters.table, letters.name,
                                retention_hours=m.vacuum_retention_hours, force=force,
                                dry_run=dry_run)
            report["dead_letters_vacuum"] = {k: v for k, v in done.as_dict().items()
                                             if k in ("operation", "files_before",
                                                      "files_after", "metrics")}
    return report


def repair(cfg: LakesinkConfig, spark: SparkSession, *, apply: bool) -> dict[str, Any]:
    fs, layout = _parts(cfg, spark)
    if (empty := _not_started(cfg, fs, layout, "FSCK")) is not None:
        return empty | {"problems": 0}
    if table_format(cfg.table.format).has_log:  # files the log lists that are gone
        from lakesink.maintenance import delta
        from lakesink.runtime.lake import delta_table

        with delta_commits(cfg, spark) if apply else contextlib.nullcontext():
            return delta.repair(delta_table(cfg, layout.table), layout.name,
                                apply=apply).as_dict()
    from lakesink.maintenance import parquet

    if apply:  # a compaction a crash left open is finished (or undone) first
        _compactor(cfg, spark).resume_locked(parquet.CompactReport(layout.name))
    return parquet.repair(fs, layout, apply=apply,
                          min_age_s=cfg.maintenance.min_age_s).as_dict()
