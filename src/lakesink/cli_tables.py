"""``lakesink dlq``, ``compact``, ``vacuum`` and ``repair``: a table's dead letters and
its maintenance, for every table of a config. What only reads a table on local disk or
S3 (``dlq show``, ``repair`` without ``--apply``, ``vacuum --dry-run``, a ``compact``
with nothing to do) answers without Spark; the rest starts a session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from lakesink.cli_common import (
    BaseOpt,
    ConfigOpt,
    JsonOpt,
    SetOpt,
    TableOpt,
    _common_flags,
    _fail_config,
    _fail_error,
    _load,
    _print_report,
    _setup_logging,
    session_of,
    app,
    out,
)
from lakesink.errors import ConfigError, LakesinkError

dlq_app = typer.Typer(help="Dead letters: the rejected records of a table.",
                      no_args_is_help=True)
app.add_typer(dlq_app, name="dlq")


def _dlq_session(config: Path | None, set_: list[str] | None, flags: dict[str, Any]):  # noqa: ANN202
    cfg = _load(config, set_, flags)
    from lakesink.app import preflight

    preflight(cfg)
    return cfg, session_of(cfg, suffix="-dlq")


def _collect(config: Path | None, set_: list[str] | None, flags: dict[str, Any],
             collect: Any) -> list[Any]:  # noqa: ANN401
    """``collect(cfg)`` of the loaded config: a configuration refusal exits 2, a
    runtime one 1, each with one line."""
    try:
        return collect(_load(config, set_, flags))  # type: ignore[no-any-return]
    except ConfigError as exc:
        _fail_config(exc)
        raise
    except LakesinkError as exc:
        _fail_error(exc)
        raise


def _print_json(data: Any) -> None:  # noqa: ANN401
    out.print(json.dumps(data, indent=1), highlight=False, markup=False, soft_wrap=True)


def _per_table(cfg: Any, suffix: str, without_spark: Any, with_spark: Any) -> list[Any]:  # noqa: ANN401
    """``without_spark(spec)`` for every table of ``cfg``; if it returns None for one (or
    a message-type route's tables are listed only through Spark), ``with_spark(spec,
    spark)`` in a session of the command's for every table not done yet."""
    specs = _tables(cfg, None)
    done = {spec.name: without_spark(spec) for spec in specs} if specs is not None else {}
    if specs is not None and all(d is not None for d in done.values()):
        return list(done.values())
    spark = session_of(cfg, suffix=suffix)
    return [done.get(spec.name) or with_spark(spec, spark)
            for spec in _tables(cfg, spark) or []]


@dlq_app.command("show")
def dlq_show(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    table: TableOpt = None,
    base_path: BaseOpt = None,
    sample: Annotated[int, typer.Option(help="Records to show.")] = 5,
    as_json: JsonOpt = False,
) -> None:
    """Pending dead letters by reason, a sample of them, and how many were replayed
    (every route's table with routes)."""
    from lakesink import dlq
    from lakesink.app import preflight

    def show(cfg: Any) -> list[Any]:  # noqa: ANN401
        preflight(cfg)
        return _per_table(cfg, "-dlq", lambda c: dlq.show(None, c, sample=sample),
                          lambda c, spark: dlq.show(spark, c, sample=sample))

    summaries = _collect(config, set_, _common_flags(None, None, table, base_path, None),
                         show)
    if as_json:  # a list of tables, as ``status --json`` prints (name, format, path first)
        _print_json(summaries)
        return
    for summary in summaries:
        _print_dlq_summary(summary)


def _tables(cfg: Any, spark: Any) -> list[Any] | None:  # noqa: ANN401
    """A spec per table: the routes' tables (a message-type route's: the tables its
    types have made so far), or the one table. ``spark`` None: the made tables are
    listed without Spark, or None is returned (a store read only through Spark)."""
    from lakesink.app import type_table_names
    from lakesink.config.plan import TableSpec, plan
    from lakesink.tables.fs import to_uri

    out: list[Any] = []
    run = plan(cfg)
    if spark is not None and any(not isinstance(r, TableSpec) for r in run.routes):
        from lakesink.runtime import storage

        storage.apply(spark, cfg.storage, run.paths())  # once, for every route's store
    for route in run.routes or run.tables:
        if isinstance(route, TableSpec):
            out.append(route)
            continue
        base = to_uri(route.template.table.base_path)  # the route's own, or the top's
        if spark is None:
            from lakesink.runtime.arrow_fs import ArrowFS

            fs: Any = ArrowFS.open(cfg.storage, base)
            if fs is None:
                return None
        else:
            from lakesink.tables.fs import HadoopFS

            fs = HadoopFS(spark, base)
        out.extend(route.table(name) for name in type_table_names(run, fs, route.route))
    return out


def _print_dlq_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    out.print(f"{summary['table']}: {sum(summary['by_reason'].values())} pending dead "
              f"letter(s) in {summary['pending_files']} file(s); "
              f"{summary['replayed_records']} replayed", highlight=False)
    counts = Table("reason", "records")
    for reason, count in summary["by_reason"].items():
        counts.add_row(reason, str(count))
    out.print(counts)
    rows = Table("topic/partition/offset", "reason", "detail", "value")
    for r in summary["sample"]:
        rows.add_row(f"{r['topic']}/{r['partition']}/{r['offset']}", r["reason"],
                     r["detail"], r["value"] if r["value"] is not None else "(null)")
    out.print(rows)


@dlq_app.command("replay")
def dlq_replay(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    table: TableOpt = None,
    base_path: BaseOpt = None,
) -> None:
    """Re-ingest the pending dead letters once through the current config; records that
    fail again stay dead letters (with their new reason)."""
    _setup_logging()
    from lakesink import dlq

    try:
        cfg, spark = _dlq_session(config, set_, _common_flags(None, None, table, base_path, None))
        results = [dlq.replay(spark, c) | ({"table": c.name} if cfg.routes else {})
                   for c in _tables(cfg, spark)]
        result = results if cfg.routes else results[0]
    except ConfigError as exc:
        _fail_config(exc)
        return
    except LakesinkError as exc:
        _fail_error(exc)
    out.print(json.dumps(result), highlight=False, markup=False, soft_wrap=True)


def _maintain(what: str, config: Path | None, set_: list[str] | None, as_json: bool,
              options: dict[str, Any], check: Any = None) -> None:  # noqa: ANN401
    """Run ``what`` (``maintenance.compact``, ``vacuum`` or ``repair`` with ``options``)
    for every table of the config, without Spark where it only reads
    (:func:`lakesink.maintenance.without_spark`); print the reports. Exit 1 when a
    report counts problems (``repair``) or a table failed; 2 when ``check(cfg)`` (before
    Spark starts) or the config refuses."""
    _setup_logging()
    from lakesink import maintenance

    run = getattr(maintenance, what)

    def each(cfg: Any) -> list[Any]:  # noqa: ANN401
        if check is not None:
            check(cfg)
        return _per_table(cfg, f"-{what}",
                          lambda c: maintenance.without_spark(what, c, **options),
                          lambda c, spark: run(c, spark, **options))

    reports = _collect(config, set_, {}, each)
    if as_json:
        _print_json(reports)
    else:
        for r in reports:
            _print_report(what, r)
    if any(r.get("problems") for r in reports):
        raise typer.Exit(1)


@app.command()
def files(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The files each table holds by its bookkeeping (committed batches only, after
    compactions and manifest roll-ups), one path per line below the table folder: what
    a reader that wants committed batches only opens (docs/architecture.md). Without
    Spark on local disk, S3 and Azure."""
    from lakesink import maintenance

    listed = _collect(config, set_, {}, lambda cfg: _per_table(
        cfg, "-files", maintenance.files, maintenance.files))
    if as_json:
        _print_json(listed)
        return
    for table in listed:
        for f in table["files"]:
            out.print(f"{table['path']}/{f['path']}", highlight=False, markup=False,
                      soft_wrap=True)


@app.command()
def compact(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Merge small files: Parquet partition folders quiet for maintenance.min_age_s
    (journaled: a crash is resumed by the next compact); Delta OPTIMIZE (optionally
    Z-ordered by maintenance.zorder_by). Safe beside a running ingestion; a Delta table
    on S3 with the single-driver log store, or on Azure, is the exception: refused while
    a stream writes it (on S3, use the DynamoDB log store; docs/storage.md)."""
    _maintain("compact", config, set_, as_json, {})


@app.command()
def vacuum(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Delta: allow a retention under 7 days; Parquet: no grace period."
    )] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only count what would be deleted; delete nothing.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete files no longer in the table: Delta VACUUM (maintenance.vacuum_retention_hours);
    Parquet: the files compactions replaced, after maintenance.replaced_grace_s."""
    from lakesink.maintenance.delta import check_retention
    from lakesink.tables.formats import table_format

    def check(cfg: Any) -> None:  # noqa: ANN401
        from lakesink.config.plan import plan

        if any(table_format(f).has_log for f in plan(cfg).formats() | {cfg.dlq.format}):
            check_retention(cfg.maintenance.vacuum_retention_hours, force=force)

    _maintain("vacuum", config, set_, as_json, {"force": force, "dry_run": dry_run}, check)


@app.command()
def repair(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    apply: Annotated[bool, typer.Option(
        "--apply", help="Fix what is found (default: only report, a dry run)."
    )] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check a table against its bookkeeping. Parquet: committed files missing or of
    another size; orphans (moved to a quarantine folder with --apply). Delta: files the
    log references that are gone (removed from the table in one commit with --apply).
    Exit 1 when problems are found."""
    _maintain("repair", config, set_, as_json, {"apply": apply})
