"""Table maintenance: ``lakesink compact``, ``vacuum`` and ``repair`` for every table of
a config (``docs/maintenance.md``). Each table's format does the work through its
:class:`~lakesink.maintenance.base.Maintainer` (``TableFormat.maintainer``: Parquet's
in :mod:`lakesink.maintenance.parquet`, lakesink's own journal; Delta's in
:mod:`lakesink.maintenance.delta`, Delta's own commands); what every format shares —
the dead letters' retention — is here. Each returns one report per table, a dict with
what it did."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lakesink.maintenance.base import Maintainer, table_commits
from lakesink.tables.formats import table_format

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.config.plan import TableSpec
    from lakesink.maintenance.watch import CompactionWatch


def maintainer(spec: TableSpec, spark: SparkSession, fmt: str | None = None,
               dead_letters: bool = False) -> Maintainer:
    """The maintainer of ``spec``'s table, or of its dead-letter table
    (``dead_letters``, of format ``fmt``)."""
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout

    layout = TableLayout.of(spec.table.base_path, spec.name)
    fs = HadoopFS(spark, layout.base)
    if dead_letters:
        from lakesink.tables.rejected import dead_letter_layout

        layout = dead_letter_layout(layout)
    cls = table_format(fmt or spec.format).maintainer_class()
    return cls(spec, spark, fs, layout)  # type: ignore[no-any-return]


def watcher(spec: TableSpec, spark: SparkSession) -> CompactionWatch | None:
    """What a running ``lakesink run`` on ``spec``'s table keeps an eye on
    (:meth:`~lakesink.maintenance.base.Maintainer.watch`), already poked once."""
    found = maintainer(spec, spark).watch()
    if found is not None:
        found.poke()
    return found


#: the operation each command's "nothing to do" report names
OPERATIONS = {"compact": "OPTIMIZE", "vacuum": "VACUUM", "repair": "FSCK"}


def without_spark(what: str, spec: TableSpec, **options: Any) -> dict[str, Any] | None:  # noqa: ANN401
    """The report of ``what`` (with the options of :func:`compact`, :func:`vacuum` or
    :func:`repair`) on ``spec``'s table when it needs no Spark, read with pyarrow,
    delta-rs and DuckDB: a table with nothing to maintain yet, a run that only reads,
    or one whose writes Python makes as safely as Hadoop's client (a Parquet
    ``vacuum`` on local disk or Azure, ``repair --apply`` on local disk:
    :meth:`~lakesink.maintenance.base.Maintainer.without_spark`). None: run it with
    Spark. Local disk, S3 and Azure only (the stores pyarrow reads here)."""
    from lakesink.runtime.arrow_fs import ArrowFS, NeedsSpark
    from lakesink.tables.layout import TableLayout

    if what == "vacuum" and (spec.dlq.retention_days is not None
                             or table_format(spec.dlq.format).has_log):
        return None  # the dead letters' retention and vacuum write through Spark
    layout = TableLayout.of(spec.table.base_path, spec.name)
    writes = (what == "vacuum" and not options.get("dry_run")) \
        or (what == "repair" and options.get("apply"))
    fs = (writes and ArrowFS.open(spec.storage, layout.base, writes=True)) \
        or ArrowFS.open(spec.storage, layout.base)
    if fs is None:
        return None
    m = table_format(spec.format).maintainer_class()(spec, None, fs, layout)
    empty = m.nothing_to_do(OPERATIONS[what])
    if empty is not None:
        return empty | ({"problems": 0} if what == "repair" else {})
    try:
        return m.without_spark(what, **options)  # type: ignore[no-any-return]
    except NeedsSpark:
        return None


def files(spec: TableSpec, spark: SparkSession | None = None) -> dict[str, Any] | None:
    """``spec``'s committed files (:meth:`~lakesink.maintenance.base.Maintainer.files`)
    with the table's name, format and path; read without Spark when ``spark`` is None
    (None: a store read only through Spark)."""
    from lakesink.runtime.arrow_fs import ArrowFS
    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout

    layout = TableLayout.of(spec.table.base_path, spec.name)
    fs = ArrowFS.open(spec.storage, layout.base) if spark is None \
        else HadoopFS(spark, layout.base)
    if fs is None:
        return None
    m = table_format(spec.format).maintainer_class()(spec, spark, fs, layout)
    listed = m.files()
    return {"table": spec.name, "format": spec.format, "path": layout.table,
            "rows": sum(f["rows"] or 0 for f in listed), "files": listed}


def compact(spec: TableSpec, spark: SparkSession, *,
            partition: tuple[str, str] | None = None,
            target_file_size: int | None = None) -> dict[str, Any]:
    """Merge the small files of ``spec``'s table. Delta only: ``partition``
    (column, value) limits it to one partition; ``target_file_size`` overrides
    ``table.target_file_size``."""
    m = maintainer(spec, spark)
    return m.nothing_to_do("OPTIMIZE") or m.compact(partition=partition,
                                                     target_file_size=target_file_size)


def vacuum(spec: TableSpec, spark: SparkSession, *, force: bool = False,
           dry_run: bool = False) -> dict[str, Any]:
    """The table's vacuum, then the dead letters' retention (``dlq.retention_days``) and,
    for a dead-letter table with a log, its own vacuum (the same retention and
    ``force``): the files of expired dead letters leave the storage
    ``maintenance.vacuum_retention_hours`` after their expiry."""
    m = maintainer(spec, spark)
    dlq = spec.dlq
    report = m.nothing_to_do("VACUUM") or m.vacuum(force=force, dry_run=dry_run)
    logged = table_format(dlq.format).has_log
    if dlq.retention_days is not None and not dry_run:
        import datetime as dt

        from lakesink.dlq import DeadLetters

        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=dlq.retention_days)
        letters = maintainer(spec, spark, dlq.format, dead_letters=True)
        with table_commits(spec, letters.fs, letters.layout, dlq.format):
            expired = DeadLetters(spark, m.fs, m.layout, dlq.format).expire(cutoff)
        report["dead_letters_expired"] = {
            "before": cutoff.isoformat(timespec="seconds"),
            ("rows" if logged else "files"): expired}
    if logged:  # its DELETEs free no file until its own vacuum
        letters = maintainer(spec, spark, dlq.format, dead_letters=True)
        if letters.nothing_to_do("VACUUM") is None:
            done = letters.vacuum(force=force, dry_run=dry_run)
            report["dead_letters_vacuum"] = {k: v for k, v in done.items() if k in (
                "operation", "files_before", "files_after", "metrics")}
    return report


def repair(spec: TableSpec, spark: SparkSession, *, apply: bool) -> dict[str, Any]:
    m = maintainer(spec, spark)
    empty = m.nothing_to_do("FSCK")
    return empty | {"problems": 0} if empty is not None else m.repair(apply=apply)
