"""The run plan: a config resolved once, at start, into the tables it serves.

A config names one table, or several routes: each route one table, or — a message-type
route — a table per type, made on first sight. The parts of lakesink below the
application (the batch function, a table's writer, maintenance, status, the dead
letters) serve one table at a time; :func:`plan` resolves each route's table into a
single-table config once, and everything asks the plan instead of re-deriving a route's
settings:

* a :class:`TableSpec` per static table: the route's table and decode sections with
  the defaults of the top level filled in, its topics, no routes;
* a :class:`TypeRouteSpec` per message-type route: the same, with the table's name left
  to each type (:meth:`TypeRouteSpec.table`).

The plan is frozen: a config change is a new plan (a restart).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lakesink.config.models import LakesinkConfig
    from lakesink.config.routes import MessageTypeConfig
    from lakesink.config.source import SourceConfig
    from lakesink.config.storage import StorageConfig
    from lakesink.config.catalog import CatalogConfig
    from lakesink.config.decode import DecodeConfig
    from lakesink.config.observe import MetricsConfig, TelemetryConfig
    from lakesink.config.run import RetryConfig, TriggerConfig
    from lakesink.config.silence import SilenceConfig
    from lakesink.config.table import DlqConfig, MaintenanceConfig, TableConfig


@dataclass(frozen=True)
class TableSpec:
    """One table's settings: a single-table config (its table, decode and topics)."""

    config: LakesinkConfig
    #: the route it comes from (``None``: the config's one table)
    route: int | None = None

    @property
    def name(self) -> str:
        return self.config.table_name

    @property
    def format(self) -> str:
        return self.config.table.format

    @property
    def table(self) -> TableConfig:
        return self.config.table

    @property
    def storage(self) -> StorageConfig:
        return self.config.storage

    @property
    def dlq(self) -> DlqConfig:
        return self.config.dlq

    @property
    def maintenance(self) -> MaintenanceConfig:
        return self.config.maintenance

    @property
    def catalog(self) -> CatalogConfig:
        return self.config.catalog

    @property
    def decode(self) -> DecodeConfig:
        return self.config.decode

    @property
    def source(self) -> SourceConfig:
        """The run's source, with this table's topics."""
        return self.config.source


@dataclass(frozen=True)
class TypeRouteSpec:
    """A message-type route: the settings every type's table shares."""

    route: int
    message_type: MessageTypeConfig
    #: the route's single-table config with a placeholder table name
    template: LakesinkConfig

    def table(self, name: str) -> TableSpec:
        """The spec of the table of one type (``name``: prefix + type)."""
        table = self.template.table.model_copy(update={"name": name})
        return TableSpec(self.template.model_copy(update={"table": table}), self.route)

    @property
    def format(self) -> str:
        return self.template.table.format

    @property
    def config(self) -> LakesinkConfig:
        """The settings every type's table shares (the template: its table's name is a
        placeholder)."""
        return self.template


@dataclass(frozen=True)
class RunPlan:
    cfg: LakesinkConfig
    #: one per route, in the config's order (empty: the config is one table)
    routes: tuple[TableSpec | TypeRouteSpec, ...]

    @property
    def tables(self) -> tuple[TableSpec, ...]:
        """The tables known at start: the static routes' (or the one table)."""
        if not self.cfg.routes:
            return (TableSpec(self.cfg),)
        return tuple(r for r in self.routes if isinstance(r, TableSpec))

    @property
    def type_routes(self) -> tuple[TypeRouteSpec, ...]:
        return tuple(r for r in self.routes if isinstance(r, TypeRouteSpec))

    def route(self, index: int) -> TableSpec | TypeRouteSpec:
        return self.routes[index]

    def static_names(self) -> set[str]:
        """The static tables' names (as configured)."""
        return {t.name for t in self.tables}

    def formats(self) -> set[str]:
        """Every table format the run writes."""
        return {r.format for r in self.routes} if self.routes else {self.cfg.table.format}

    @property
    def storage(self) -> StorageConfig:
        return self.cfg.storage

    @property
    def source(self) -> SourceConfig:
        return self.cfg.source

    @property
    def table_defaults(self) -> TableConfig:
        """The top-level table section: the one table, or the routes' defaults (and
        where the silence table is written)."""
        return self.cfg.table

    @property
    def silence(self) -> SilenceConfig:
        return self.cfg.silence

    @property
    def retry(self) -> RetryConfig:
        return self.cfg.retry

    @property
    def trigger(self) -> TriggerConfig:
        return self.cfg.trigger

    @property
    def metrics(self) -> MetricsConfig:
        return self.cfg.metrics

    @property
    def telemetry(self) -> TelemetryConfig:
        return self.cfg.telemetry

    def checkpoint_uri(self) -> str:
        """The run's checkpoint: ``checkpoint``, else the default of a routed config
        (one query for every route) or of the one table (in its ``.lakesink`` folder)."""
        from lakesink.tables.fs import to_uri
        from lakesink.tables.layout import TableLayout

        cfg = self.cfg
        if cfg.checkpoint or cfg.routes:
            return to_uri(cfg.checkpoint or cfg.routed_checkpoint)
        return TableLayout.of(cfg.table.base_path, cfg.table_name).default_checkpoint

    def paths(self) -> list[str]:
        """Every path the run reads or writes: the tables' base paths and the
        checkpoint (as configured: not yet URIs)."""
        return [p for p in (*self.base_paths(), self.cfg.checkpoint) if p]

    def base_paths(self) -> list[str]:
        """Every table base path (the routes' own ones too)."""
        paths = [self.cfg.table.base_path]
        for r in self.routes:
            paths.append(r.config.table.base_path)
        return paths


def plan(cfg: LakesinkConfig) -> RunPlan:
    """``cfg`` resolved once (see the module's docstring)."""
    routes: list[TableSpec | TypeRouteSpec] = []
    for i, route in enumerate(cfg.routes):
        if route.message_type is None:
            routes.append(TableSpec(_single_table(cfg, i), i))
        else:
            routes.append(TypeRouteSpec(i, route.message_type, _single_table(cfg, i, "_")))
    return RunPlan(cfg, tuple(routes))


def _single_table(cfg: LakesinkConfig, index: int, table_name: str | None = None
                  ) -> LakesinkConfig:
    """Route ``index`` as a single-table config: its table and decode sections (their
    defaults from the top level, resolved by the config's validation), its topics."""
    table, decode = cfg.route_sections(index)
    route = cfg.routes[index]
    if table_name is not None:
        table = table.model_copy(update={"name": table_name})
    source = cfg.source
    if source.kafka is not None:
        kafka = source.kafka.model_copy(update={"topics": list(route.topics),
                                                "topic_pattern": route.topic_pattern})
        source = source.model_copy(update={"kafka": kafka})
    return cfg.model_copy(update={"table": table, "decode": decode, "source": source,
                                  "routes": []})
