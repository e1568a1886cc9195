"""Table maintenance: ``lakesink compact``, ``vacuum`` and ``repair`` for every table of
a config (``docs/maintenance.md``). Parquet: :mod:`lakesink.maintenance.parquet`
(lakesink's own journal); Delta: :mod:`lakesink.maintenance.delta` (Delta's own
commands). Each returns one report per table, a dict with what it did."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lakesink.errors import ConfigError

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


def compact(cfg: LakesinkConfig, spark: SparkSession) -> dict[str, Any]:
    """Merge the small files of the table ``cfg`` names (a route's: its route config)."""
    m = cfg.maintenance
    fs, layout = _parts(cfg, spark)
    if cfg.table.format == "delta":
        from lakesink.maintenance import delta

        return delta.optimize(spark, layout.table, layout.name, zorder_by=m.zorder_by,
                              target_file_size=cfg.table.target_file_size).as_dict()
    if cfg.catalog.type in ("iceberg", "quix"):
        raise ConfigError("catalog.type", f"compacting a Parquet table registered in a "
                          f"{cfg.catalog.type} catalog is not supported yet: the catalog "
                          "lists the files compaction replaces (a Hive catalog, which "
                          "lists folders, is fine)")
    from lakesink.maintenance.parquet import ParquetCompactor

    target = int(cfg.table.target_file_size or 2 * DEFAULT_SMALL)
    small = int(m.small_file_size or (cfg.table.target_file_size or 2 * DEFAULT_SMALL) // 2)
    return ParquetCompactor(spark, fs, layout, small=small, target=target,
                            min_age_s=m.min_age_s,
                            compression=cfg.table.compression).run().as_dict()


def vacuum(cfg: LakesinkConfig, spark: SparkSession, *, force: bool = False,
           dry_run: bool = False) -> dict[str, Any]:
    """The table's vacuum, then the dead letters' retention (``dlq.retention_days``)."""
    m = cfg.maintenance
    fs, layout = _parts(cfg, spark)
    if cfg.table.format == "delta":
        from lakesink.maintenance import delta

        report = delta.vacuum(spark, layout.table, layout.name,
                              retention_hours=m.vacuum_retention_hours, force=force,
                              dry_run=dry_run).as_dict()
    else:
        from lakesink.maintenance.parquet import vacuum_replaced

        report = vacuum_replaced(fs, layout, 0 if force else m.replaced_grace_s).as_dict()
    if cfg.dlq.retention_days is not None and not dry_run:
        import datetime as dt

        from lakesink.dlq import DeadLetters

        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=cfg.dlq.retention_days)
        expired = DeadLetters(spark, fs, layout, cfg.dlq.format).expire(cutoff)
        report["dead_letters_expired"] = {
            "before": cutoff.isoformat(timespec="seconds"),
            ("rows" if cfg.dlq.format == "delta" else "files"): expired}
    return report


def repair(cfg: LakesinkConfig, spark: SparkSession, *, apply: bool) -> dict[str, Any]:
    fs, layout = _parts(cfg, spark)
    if cfg.table.format == "delta":
        from lakesink.maintenance import delta
        from lakesink.status import _delta_table

        return delta.repair(_delta_table(cfg, layout.table), layout.name,
                            apply=apply).as_dict()
    from lakesink.maintenance import parquet

    return parquet.repair(fs, layout, apply=apply).as_dict()
