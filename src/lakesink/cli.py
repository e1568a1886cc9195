"""The ``lakesink`` command line.

Exit codes: 0 done (or stopped by SIGINT/SIGTERM), 1 runtime failure, 2 bad configuration.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from lakesink import __version__
from lakesink.errors import ConfigError, LakesinkError, one_line

app = typer.Typer(
    name="lakesink",
    help="Stream events from Kafka into Parquet or Delta tables, exactly once, on Spark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, soft_wrap=True)  # an error stays one line, whatever the width
out = Console()

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config file.", envvar="LAKESINK_CONFIG")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override any key: --set table.compression=zstd (repeatable)."),
]
BootstrapOpt = Annotated[
    str | None, typer.Option("--bootstrap-servers", help="source.kafka.bootstrap_servers")
]
TopicOpt = Annotated[list[str] | None, typer.Option("--topic", "-t", help="source.kafka.topics")]
TableOpt = Annotated[str | None, typer.Option("--table", help="table.name")]
BaseOpt = Annotated[str | None, typer.Option("--base-path", help="table.base_path")]
MasterOpt = Annotated[str | None, typer.Option("--master", help="spark.master")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _setup_logging(flag: str | None = None, cfg: Any = None) -> None:  # noqa: ANN401
    """Log lines on stderr (:mod:`lakesink.observe.logs`); called again once the config
    is loaded, for its ``logging`` section."""
    from lakesink.observe.logs import level_name, setup_logging

    section = getattr(cfg, "logging", None)
    setup_logging(level_name(flag, section.level if section else None),
                  section.format if section else "text")


def _load(config: Path | None, sets: list[str] | None, flags: dict[str, Any],  # noqa: ANN202
          compat: str | None = None):
    import os

    from lakesink.config import load_config

    try:
        return load_config(config, overrides=sets or [], flags=flags, compat=compat)
    except ConfigError as exc:
        given = (config is not None or sets or any(v is not None for v in flags.values())
                 or any(k.startswith("LAKESINK_") for k in os.environ))
        if given or not exc.key.startswith("source"):
            raise
        raise ConfigError(exc.key, "no configuration was given (no -c file, --set or "
                          f"LAKESINK_* variable), so {exc.message}",
                          fix="pass -c lakesink.yaml (examples/ has some), --set keys or "
                          "LAKESINK_* variables; `lakesink demo` runs one against a local "
                          "broker") from None


def _print_config_file(cfg: Any) -> None:  # noqa: ANN401
    """``--print-config``: the resolved config as a config file (secrets named, not written)."""
    from lakesink.config.loader import config_file_text

    out.print(config_file_text(cfg), end="", highlight=False, markup=False, soft_wrap=True)


def _fail_error(exc: LakesinkError) -> None:
    """A refusal that is not the config's: one ``error:`` line, exit 1."""
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
    raise typer.Exit(1) from None


def _fail_other(exc: Exception) -> None:
    """An unexpected failure of a command (a store's, a library's): one line, exit 1."""
    err.print(f"[bold red]error:[/] {escape(one_line(exc, 500))}", highlight=False)
    raise typer.Exit(1) from None


def _fail_config(exc: ConfigError) -> None:
    err.print(f"[bold red]config error:[/] {escape(str(exc))}", highlight=False)
    raise typer.Exit(2)


def _common_flags(bootstrap: str | None, topics: list[str] | None, table: str | None,
                  base: str | None, master: str | None) -> dict[str, Any]:
    return {
        "source.kafka.bootstrap_servers": bootstrap,
        "source.kafka.topics": topics or None,
        "table.name": table,
        "table.base_path": base,
        "spark.master": master,
    }


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    if version:
        out.print(f"lakesink {__version__}")
        raise typer.Exit(0)


@app.command()
def status(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document, for scripts.")
                       ] = False,
) -> None:
    """Per table: the last committed batch and its time, batches, rows, files, dead
    letters by reason, schema version and the source's lag (Kafka per partition; Redis streams
    and lists; Danube) — without Spark."""
    from lakesink.config.plan import plan
    from lakesink.status import status as read_status

    try:
        cfg = _load(config, set_, {})
        tables = read_status(plan(cfg))
    except ConfigError as exc:
        _fail_config(exc)
        return
    if as_json:
        out.print_json(json.dumps([t.as_dict() for t in tables]))
        return
    from rich.table import Table

    for t in tables:
        grid = Table(title=f"{t.table} ({t.format}) {t.path}", show_header=False)
        grid.add_row("last batch", "—" if t.last_batch is None
                     else f"{t.last_batch} at {t.last_commit}")
        grid.add_row("committed", f"{t.batches:,} batch(es), {t.rows:,} row(s), "
                     f"{t.files:,} file(s)" + (f" of {t.mean_file_bytes / 1024:,.0f} KiB "
                                               "on average" if t.mean_file_bytes else ""))
        if t.hint:
            grid.add_row("hint", t.hint)
        grid.add_row("schema version", str(t.schema_version or "—"))
        grid.add_row("dead letters", ", ".join(f"{r}: {n}" for r, n in
                                               sorted(t.rejected.items())) or "none")
        if t.lag_error:
            grid.add_row("lag", f"unavailable ({t.lag_error})")
        elif t.lag is not None:
            grid.add_row("lag", ", ".join(f"{p}: {n}" for p, n in t.lag.items())
                         or "no batch committed yet")
        out.print(grid)


@app.command()
def run(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    until_caught_up: Annotated[
        bool, typer.Option("--until-caught-up", help="Process what the topic holds now, then exit.")
    ] = False,
    bootstrap_servers: BootstrapOpt = None,
    topic: TopicOpt = None,
    table: TableOpt = None,
    base_path: BaseOpt = None,
    master: MasterOpt = None,
    log_level: Annotated[str | None, typer.Option(
        help="Python log level (default: logging.level, else LOG_LEVEL / LOGLEVEL, else "
        "INFO).")] = None,
    print_config: Annotated[bool, typer.Option(
        "--print-config", help="Print the config this command line and environment make, "
        "as a config file (secrets left out, named), and exit.")] = False,
    compat: Annotated[str | None, typer.Option(
        "--compat", help="quix: the Quix TS Datalake Sink's environment variables are the "
        "config (also when input is set and no --config is given); docs/migrating.md")
    ] = None,
) -> None:
    """Stream from the source into the table until SIGINT/SIGTERM (or until caught up)."""
    _setup_logging(log_level)
    flags = _common_flags(bootstrap_servers, topic, table, base_path, master)
    if until_caught_up:
        flags["trigger.until_caught_up"] = True
    try:
        cfg = _load(config, set_, flags, compat)
        if print_config:
            _print_config_file(cfg)
            return
    except ConfigError as exc:
        _fail_config(exc)
        return
    _run_loaded(cfg, log_level)


def _run_loaded(cfg: Any, log_level: str | None) -> None:  # noqa: ANN401
    """``run`` once the config is resolved: the checks that need no Spark, then the
    stream until a signal (or caught up); a summary line at the end."""
    try:
        _setup_logging(log_level, cfg)
        # Everything that can refuse without Spark runs before the JVM starts.
        from lakesink.app import preflight

        preflight(cfg)
    except ConfigError as exc:
        _fail_config(exc)
        return
    from lakesink.app import Pipeline
    from lakesink.runtime.shutdown import StopRequest

    stop = StopRequest()
    try:
        spark = _spark(cfg)
        stop.install()
        pipeline = Pipeline.build(cfg, spark)
        stats = pipeline.run(stop=stop)
    except ConfigError as exc:
        _fail_config(exc)
        return
    except LakesinkError as exc:
        _fail_error(exc)
    except Exception as exc:  # noqa: BLE001 - a failed query: say what, exit 1
        err.print(f"[bold red]query failed:[/] {type(exc).__name__}: {escape(str(exc)[:2000])}",
                  highlight=False)
        raise typer.Exit(1) from None
    summary = stats.as_dict()
    if pipeline.silence is not None:
        summary["silence"] = pipeline.silence.stats.as_dict()
    err.print(f"[green]stopped[/] {json.dumps(summary)}", highlight=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "help_option_names": []})
def kdi(ctx: typer.Context) -> None:
    """kafka-delta-ingest's command lines: `lakesink kdi ingest [TOPIC] [TABLE] [flags]`
    with its flags and environment variables, into the same Delta table, taking over
    from its offsets; `lakesink kdi repair --table_url URL` (the fork's repair: drop
    missing files from the log, then OPTIMIZE). See docs/migrating.md."""
    from lakesink import kdi

    args = list(ctx.args)
    if "--help" in args or "-h" in args or not args:
        from lakesink.compat.kdi import help_text

        command = args[0] if args and args[0] in ("ingest", "repair") else None
        print(help_text(command), end="")
        raise typer.Exit(0 if args else 2)
    _setup_logging(None)
    if ctx.args[:1] == ["repair"]:
        _kdi_repair(list(ctx.args))
        return
    try:
        cfg, print_config = kdi.ingest_config(list(ctx.args), os.environ)
        if print_config:
            _print_config_file(cfg)
            return
    except ConfigError as exc:
        _fail_config(exc)
        return
    except LakesinkError as exc:
        _fail_error(exc)
    except Exception as exc:  # noqa: BLE001 - the table's store refused (S3, delta-rs)
        _fail_other(exc)
    _run_loaded(cfg, None)


def _kdi_repair(argv: list[str]) -> None:
    """The fork's ``repair``: lakesink's ``repair --apply`` (files the log references
    that are gone leave the table in one commit), then ``compact`` (OPTIMIZE) with the
    fork's target size and partition filter. Both reports are printed; exit 0 when both
    ran, as the fork."""
    from lakesink import maintenance
    from lakesink.compat import kdi
    from lakesink.config import load_config
    from lakesink.config.plan import TableSpec

    log = logging.getLogger("lakesink.kdi")
    try:
        args = kdi.parse_repair(argv, os.environ)
        if args.partial_filter:
            log.warning("%s without its pair: the whole table is optimized, as "
                        "kafka-delta-ingest does", args.partial_filter)
        cfg = load_config(flags=kdi.repair_flags(args), compat="off")
        spark = _spark(cfg, suffix="-repair")
        spec = TableSpec(cfg)
        _print_report("repair", maintenance.repair(spec, spark, apply=True))
        _print_report("compact", maintenance.compact(
            spec, spark, partition=args.partition, target_file_size=args.optimize_target_size))
    except ConfigError as exc:
        if exc.key == "partition":  # the flag that named it
            exc = ConfigError("--optimize_partition", exc.message)
        _fail_config(exc)
        return
    except LakesinkError as exc:
        _fail_error(exc)
    except Exception as exc:  # noqa: BLE001 - Delta's own (no table there…)
        _fail_other(exc)


@app.command()
def validate(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    bootstrap_servers: BootstrapOpt = None,
    topic: TopicOpt = None,
    table: TableOpt = None,
    base_path: BaseOpt = None,
    master: MasterOpt = None,
    offline: Annotated[bool, typer.Option("--offline", help="Skip the broker check.")] = False,
) -> None:
    """Print the resolved config (secrets redacted) and run the start-up checks."""
    from lakesink.config import redacted_dict

    try:
        cfg = _load(config, set_, _common_flags(bootstrap_servers, topic, table, base_path, master))
        out.print(yaml.safe_dump(redacted_dict(cfg), sort_keys=False).rstrip(), highlight=False,
                  markup=False)
        from lakesink.app import preflight

        checks = preflight(cfg)
        if not offline:
            from lakesink import sources

            sources.check_reachable(cfg.source)
            checks.append(f"source: {sources.describe(cfg.source)} reachable")
    except ConfigError as exc:
        _fail_config(exc)
        return
    except LakesinkError as exc:
        err.print(f"[bold red]check failed:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    for line in checks:
        err.print(f"[green]ok[/] {line}", highlight=False)


@app.command()
def demo(
    events: Annotated[int, typer.Option(help="Sensor events to produce.")] = 100_000,
    lake: Annotated[Path, typer.Option(help="Lake folder.")] = Path("lake"),
    partitions: Annotated[int, typer.Option(help="Topic partitions.")] = 4,
    table_format: Annotated[
        str, typer.Option("--format", help="Table format: parquet or delta.")
    ] = "parquet",
    storage: Annotated[
        str, typer.Option("--storage", help="Where the lake is: local (the --lake folder) "
                          "or s3 (a local S3 server, SeaweedFS, started for the demo).")
    ] = "local",
    source: Annotated[
        str, typer.Option("--source", help="Where the events come from: kafka (a local KRaft "
                          "broker) or redis (a local redis-server, one stream).")
    ] = "kafka",
    set_: SetOpt = None,
) -> None:
    """Start a local broker, produce sample sensor events, ingest them, show the result.
    --set and LAKESINK_* variables apply as for run (e.g. --set metrics.port=9100)."""
    _setup_logging()
    from lakesink.demo import run_demo

    try:
        if table_format not in ("parquet", "delta"):
            raise ConfigError("--format", f"must be parquet or delta (got {table_format!r})")
        if storage not in ("local", "s3"):
            raise ConfigError("--storage", f"must be local or s3 (got {storage!r})")
        if source not in ("kafka", "redis"):
            raise ConfigError("--source", f"must be kafka or redis (got {source!r})")
        run_demo(events=events, lake=lake, partitions=partitions, console=out,
                 table_format=table_format, storage=storage, source=source,
                 overrides=set_ or [])
    except ConfigError as exc:
        _fail_config(exc)
    except LakesinkError as exc:
        err.print(f"[bold red]demo failed:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None


dlq_app = typer.Typer(help="Dead letters: the rejected records of a table.",
                      no_args_is_help=True)
app.add_typer(dlq_app, name="dlq")


def _spark(cfg: Any, *, suffix: str = ""):  # noqa: ANN202
    """The SparkSession of a command, from the config's ``spark`` section."""
    from lakesink.catalog.hive import spark_conf as catalog_conf
    from lakesink.config.plan import plan
    from lakesink.runtime import storage
    from lakesink.runtime.spark import build_spark_session

    return build_spark_session(
        master=cfg.spark.master, app_name=cfg.spark.app_name + suffix,
        conf={**storage.spark_conf(cfg.storage), **catalog_conf(cfg.catalog), **cfg.spark.conf},
        driver_memory=cfg.spark.driver_memory, log_level=cfg.spark.log_level,
        storage_uris=storage.uris(plan(cfg).paths()))


def _dlq_session(config: Path | None, set_: list[str] | None, flags: dict[str, Any]):  # noqa: ANN202
    cfg = _load(config, set_, flags)
    from lakesink.app import preflight

    preflight(cfg)
    return cfg, _spark(cfg, suffix="-dlq")


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

    try:
        cfg, spark = _dlq_session(config, set_, _common_flags(None, None, table, base_path, None))
        summaries = [dlq.show(spark, c, sample=sample) for c in _tables(cfg, spark)]
    except ConfigError as exc:
        _fail_config(exc)
        return
    if as_json:
        shown = summaries if cfg.routes else summaries[0]
        out.print(json.dumps(shown, indent=1), highlight=False, markup=False, soft_wrap=True)
        return
    for summary in summaries:
        _print_dlq_summary(summary)


def _tables(cfg: Any, spark: Any) -> list[Any]:  # noqa: ANN401
    """A spec per table: the routes' tables (a message-type route's: the tables its
    types have made so far), or the one table."""
    from lakesink.app import type_table_names
    from lakesink.config.plan import TableSpec, plan

    out = []
    for route in plan(cfg).routes or (TableSpec(cfg),):
        if isinstance(route, TableSpec):
            out.append(route)
        else:
            out.extend(route.table(name)
                       for name in type_table_names(cfg, spark, route.route))
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
              each: Any, check: Any = None) -> None:  # noqa: ANN401
    """Run ``each(spec, spark)`` for every table of the config; print the reports.
    Exit 1 when a report counts problems (``repair``) or a table failed; 2 when
    ``check(cfg)`` (before Spark starts) or the config refuses."""
    _setup_logging()
    from lakesink import maintenance  # noqa: F401 - fail early if it does not import

    try:
        cfg = _load(config, set_, {})
        if check is not None:
            check(cfg)
        spark = _spark(cfg, suffix=f"-{what}")
        reports = [each(c, spark) for c in _tables(cfg, spark)]
    except ConfigError as exc:
        _fail_config(exc)
        return
    except LakesinkError as exc:
        _fail_error(exc)
    if as_json:
        out.print(json.dumps(reports, indent=1), highlight=False, markup=False,
                  soft_wrap=True)
    else:
        for r in reports:
            _print_report(what, r)
    if any(r.get("problems") for r in reports):
        raise typer.Exit(1)


def _print_report(what: str, r: dict[str, Any]) -> None:
    from rich.table import Table

    grid = Table(title=f"{what}: {r['table']} ({r['format']})", show_header=False)
    for key, value in r.items():
        if key in ("table", "format") or value in (None, [], {}):
            continue
        if isinstance(value, list) and len(value) > 20:
            value = [*value[:20], f"… {len(value) - 20} more"]
        grid.add_row(key.replace("_", " "), escape(str(value)))
    out.print(grid)


@app.command()
def compact(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Merge small files: Parquet partition folders quiet for maintenance.min_age_s
    (journaled: a crash is resumed by the next compact); Delta OPTIMIZE (optionally
    Z-ordered by maintenance.zorder_by). Safe beside a running ingestion."""
    from lakesink import maintenance

    _maintain("compact", config, set_, as_json, maintenance.compact)


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
    from lakesink import maintenance
    from lakesink.maintenance.delta import check_retention
    from lakesink.tables.formats import table_format

    def check(cfg: Any) -> None:  # noqa: ANN401
        from lakesink.config.plan import plan

        if any(table_format(f).has_log for f in plan(cfg).formats() | {cfg.dlq.format}):
            check_retention(cfg.maintenance.vacuum_retention_hours, force=force)

    _maintain("vacuum", config, set_, as_json,
              lambda c, spark: maintenance.vacuum(c, spark, force=force, dry_run=dry_run),
              check)


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
    from lakesink import maintenance

    _maintain("repair", config, set_, as_json,
              lambda c, spark: maintenance.repair(c, spark, apply=apply))


@app.command()
def jars(
    config: ConfigOpt = None,
    set_: SetOpt = None,
) -> None:
    """The connector jars a run of this config needs, comma-separated: for
    spark-submit's --jars (only the storage connectors its paths use)."""
    from lakesink.config.plan import plan
    from lakesink.runtime import storage
    from lakesink.runtime.jars import connector_jars, unused_storage_artifacts

    try:
        cfg = _load(config, set_, {})
    except ConfigError as exc:
        _fail_config(exc)
        return
    skip = unused_storage_artifacts(storage.uris(plan(cfg).paths()))
    print(",".join(str(j) for j in connector_jars(skip)))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
