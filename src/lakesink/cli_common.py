"""What the ``lakesink`` commands share: the Typer app, the consoles, the options, the
config loading and the one-line failures (exit 1 runtime, 2 configuration)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

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


def session_of(cfg: Any, *, suffix: str = ""):  # noqa: ANN202
    """The SparkSession of a command (and of the demo), from the config's ``spark``,
    ``storage`` and ``catalog`` sections."""
    from lakesink.catalog.hive import spark_conf as catalog_conf
    from lakesink.config.plan import plan
    from lakesink.runtime import storage
    from lakesink.runtime.spark import build_spark_session

    return build_spark_session(
        master=cfg.spark.master, app_name=cfg.spark.app_name + suffix,
        conf={**storage.spark_conf(cfg.storage), **catalog_conf(cfg.catalog), **cfg.spark.conf},
        driver_memory=cfg.spark.driver_memory, log_level=cfg.spark.log_level,
        storage_uris=storage.uris(plan(cfg).paths()))


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
