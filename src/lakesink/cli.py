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
from rich.markup import escape

from lakesink import __version__
from lakesink.cli_common import (
    BaseOpt,
    BootstrapOpt,
    ConfigOpt,
    MasterOpt,
    SetOpt,
    TableOpt,
    TopicOpt,
    _common_flags,
    _fail_config,
    _fail_error,
    _fail_other,
    _load,
    _print_config_file,
    _print_report,
    _setup_logging,
    session_of,
    app,
    err,
    out,
)
from lakesink.errors import ConfigError, LakesinkError


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
        from lakesink.config.plan import plan
        from lakesink.observe import Observer

        preflight(cfg)
        # /healthz from the start (Spark takes seconds); /readyz says "starting"
        early = Observer.early(plan(cfg))
    except ConfigError as exc:
        _fail_config(exc)
        return
    from lakesink.app import Pipeline
    from lakesink.runtime.shutdown import StopRequest

    stop = StopRequest()
    try:
        spark = session_of(cfg)
        stop.install()
        pipeline = Pipeline.build(cfg, spark)
        taken, early = early, None  # the run stops it
        stats = pipeline.run(stop=stop, observer=taken)
    except ConfigError as exc:
        _fail_config(exc)
        return
    except LakesinkError as exc:
        _fail_error(exc)
    except Exception as exc:  # noqa: BLE001 - a failed query: say what, exit 1
        err.print(f"[bold red]query failed:[/] {type(exc).__name__}: {escape(str(exc)[:2000])}",
                  highlight=False)
        raise typer.Exit(1) from None
    finally:
        if early is not None:  # the run never took the endpoints over
            early.stop()
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
        spark = session_of(cfg, suffix="-repair")
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
    """Print the resolved config (secrets redacted) and run the start-up checks. The
    source is tried once: a refused connection fails at once (``run`` waits up to the
    source's connect_timeout_s for a server that is starting)."""
    from lakesink.config import redacted_dict

    try:
        cfg = _load(config, set_, _common_flags(bootstrap_servers, topic, table, base_path, master))
        out.print(yaml.safe_dump(redacted_dict(cfg), sort_keys=False).rstrip(), highlight=False,
                  markup=False)
        from lakesink.app import preflight

        checks = preflight(cfg)
        if not offline:
            from lakesink import sources

            err.print(f"checking that {sources.describe(cfg.source)} answers…",
                      highlight=False, markup=False)
            sources.check_reachable(cfg.source, timeout_s=0)
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
        str, typer.Option("--storage", help="Where the lake is: local (the --lake folder), "
                          "s3 (a local S3 server, SeaweedFS, started for the demo) or azure "
                          "(a local Azure Blob emulator, Azurite, started for the demo).")
    ] = "local",
    source: Annotated[
        str, typer.Option("--source", help="Where the events come from: kafka (a local KRaft "
                          "broker) or redis (a local redis-server, one stream).")
    ] = "kafka",
    keep_running: Annotated[bool, typer.Option(
        "--keep-running", help="After the sample events, keep the broker and the stream "
        "running with live events (20 a second) until Ctrl-C, to watch the status page and "
        "/metrics (metrics.port, default 9108).")] = False,
    set_: SetOpt = None,
) -> None:
    """Start a local broker, produce sample sensor events, ingest them, show the result.
    --set and LAKESINK_* variables apply as for run (e.g. --set metrics.port=9100)."""
    _setup_logging()
    from lakesink.demo import run_demo

    try:
        if table_format not in ("parquet", "delta"):
            raise ConfigError("--format", f"must be parquet or delta (got {table_format!r})")
        if storage not in ("local", "s3", "azure"):
            raise ConfigError("--storage", f"must be local, s3 or azure (got {storage!r})")
        if source not in ("kafka", "redis"):
            raise ConfigError("--source", f"must be kafka or redis (got {source!r})")
        run_demo(events=events, lake=lake, partitions=partitions, console=out,
                 table_format=table_format, storage=storage, source=source,
                 overrides=set_ or [], keep_running=keep_running)
    except ConfigError as exc:
        _fail_config(exc)
    except LakesinkError as exc:
        err.print(f"[bold red]demo failed:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None


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


from lakesink import cli_tables  # noqa: E402,F401 - registers dlq, compact, vacuum, repair

if __name__ == "__main__":
    main()
