"""Route configuration: inheritance, derived subscription and errors naming the route."""

from __future__ import annotations

from pathlib import Path

from typing import Any

import pytest

from lakesink.config.loader import load_config
from lakesink.errors import ConfigError
from lakesink.config.plan import plan


def _load(routes: list[dict[str, Any]], **flags: Any):  # noqa: ANN202
    return load_config(overrides=["source.kafka.bootstrap_servers=a:1"],
                       flags={"routes": routes, **flags}, env={})


def test_routes_inherit_table_and_decode_and_derive_topics() -> None:
    cfg = _load([{"topics": ["a"]},
                 {"topics": ["b", "c"], "table": {"name": "bc", "format": "delta"}}],
                **{"table.partition_by": ["location"], "table.compression": "zstd"})
    assert cfg.source.kafka.topics == ["a", "b", "c"]
    first, second = plan(cfg).route(0).config, plan(cfg).route(1).config
    assert (first.table.name, first.table.format, first.table.partition_by) == (
        "a", "parquet", ["location"])
    assert (second.table.name, second.table.format, second.table.compression) == (
        "bc", "delta", "zstd")
    assert second.source.kafka.topics == ["b", "c"] and second.routes == []


def test_a_pattern_route_makes_a_pattern_subscription() -> None:
    cfg = _load([{"topics": ["a.b"]}, {"topic_pattern": r"m\..*", "table": {"name": "m"}}])
    assert cfg.source.kafka.topic_pattern == r"a\.b|(?:m\..*)"
    assert cfg.source.kafka.topics == []


def test_a_route_with_another_format_does_not_inherit_the_schema() -> None:
    cfg = _load([{"topics": ["a"]}, {"topics": ["b"], "decode": {"format": "string"}}],
                **{"decode.schema": "id bigint"})
    assert plan(cfg).route(0).config.decode.schema_ == "id bigint"
    assert plan(cfg).route(1).config.decode.schema_ is None


@pytest.mark.parametrize("routes, key, message", [
    ([{"topics": ["a"]}, {"topics": ["b", "c"]}], "routes.1.table.name", "required unless"),
    ([{"topics": ["a"]}, {"topics": ["A"]}], "routes.1.table.name", "also the table of routes.0"),
    ([{"topics": ["b"], "table": {"partition_by": "x y"}}], "routes.0.table.partition_by",
     "not a plain column name"),
    ([{"topics": ["b"], "table": {"bogus": 1}}], "routes.0.table.bogus", "unknown key"),
    ([{"topics": ["b"], "table": {"compresion": "zstd"}}], "routes.0.table.compresion",
     "unknown key (did you mean 'compression'?)"),
    ([{"topics": ["b"], "decode": {"avro": {"schema_fil": "x.avsc"}}}],
     "routes.0.decode.avro.schema_fil", "(did you mean 'schema_file'?)"),
    ([{"topics": ["b"], "table": {"unknown_fields": "reject"}}],
     "routes.0.table.unknown_fields", "needs schema_evolution=strict"),
    ([{"topics": ["b"], "decode": {"format": "avro"}}], "routes.0.decode.avro.schema_file",
     "required for format avro"),
    ([{"topics": ["b"], "table": {"transforms": ["bad"]}}], "routes.0.table.transforms.0",
     "not 'name: expression'"),
    ([{"topics": ["a"], "topic_pattern": "x"}], "routes.0", "exactly one of"),
    ([{"topics": ["a"], "message_type": {"field": "type"}, "decode": {"format": "string"}}],
     "routes.0.message_type", "needs decode.format json"),
    ([{"topics": ["a"], "message_type": {"field": "type"}, "table": {"name": "x"}}],
     "routes.0.table.name", "the message type names the tables"),
    ([{"topics": ["a"], "message_type": {"field": "a.b"}}], "routes.0.message_type.field",
     "not a plain field name"),
    ([{"topics": ["a"], "message_type": {"field": "t", "allow": "("}}],
     "routes.0.message_type.allow", "not a regular expression"),
    ([{"topic_pattern": "x("}], "routes.0.topic_pattern", "not a regular expression"),
])
def test_route_errors_name_the_route_key(routes: list[dict[str, Any]], key: str,
                                         message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(routes)
    assert err.value.key == key
    assert message in err.value.message


def test_no_subscription_and_no_routes_is_an_error() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["source.kafka.bootstrap_servers=a:1"], env={})
    assert err.value.key == "source.kafka"


def test_preflight_names_the_route() -> None:
    from lakesink.app import preflight

    cfg = _load([{"topics": ["a"]}, {"topics": ["b"], "table": {"partition_by": ["nope"]}}],
                **{"decode.schema": "id bigint", "table.base_path": "/tmp/lakesink-no-such"})
    with pytest.raises(ConfigError) as err:
        preflight(cfg)
    assert err.value.key == "routes.1.table.partition_by"


def test_message_type_route_configs_per_type() -> None:
    cfg = _load([{"topics": ["a", "b"], "message_type": {"field": "type",
                                                           "table_prefix": "ev_"}}])
    assert plan(cfg).route(0).table("ev_order").config.table.name == "ev_order"
    assert plan(cfg).route(0).table("ev_order").config.source.kafka.topics == ["a", "b"]


def test_a_type_routes_tables_are_listed_where_it_makes_them(tmp_path) -> None:
    """A message-type route with its own ``table.base_path`` makes its tables there; the
    tables it made were listed below the top level's base path instead (so a restart
    counted none against ``max_tables``, and the maintenance commands missed them)."""
    import pyarrow.fs as pafs

    from lakesink.app import type_table_names
    from lakesink.runtime.arrow_fs import ArrowFS
    from lakesink.tables.layout import TableLayout

    own, top = tmp_path / "own", tmp_path / "top"
    cfg = _load([{"topics": ["a"], "message_type": {"field": "type", "table_prefix": "ev_"},
                  "table": {"base_path": str(own)}}],
                **{"table.base_path": str(top)})
    for base, name in ((own, "ev_order"), (top, "ev_stale")):
        layout = Path(TableLayout.of(str(base), name).layout_file.removeprefix("file:"))
        layout.parent.mkdir(parents=True)
        layout.write_text("{}")
    fs = ArrowFS(pafs.LocalFileSystem())
    assert type_table_names(plan(cfg), fs, 0) == ["ev_order"]


def test_the_run_plan_resolves_every_route_once() -> None:
    """``plan(cfg)``: a spec per route, frozen; the static tables, the type routes, the
    formats and base paths the run writes are read from it (no Spark)."""
    import dataclasses

    from lakesink.config.plan import TableSpec, TypeRouteSpec

    cfg = _load([{"topics": ["a"], "table": {"format": "delta", "base_path": "/other"}},
                 {"topics": ["b"], "message_type": {"field": "type", "table_prefix": "t_"}}],
                **{"table.base_path": "/lake"})
    run = plan(cfg)
    static, typed = run.routes
    assert isinstance(static, TableSpec) and isinstance(typed, TypeRouteSpec)
    assert run.tables == (static,) and run.type_routes == (typed,)
    assert (static.name, static.format, static.route) == ("a", "delta", 0)
    assert run.static_names() == {"a"} and run.formats() == {"delta", "parquet"}
    assert sorted(set(run.base_paths())) == ["/lake", "/other"]
    order = typed.table("t_order")
    assert (order.name, order.route, order.config.source.kafka.topics) == ("t_order", 1, ["b"])
    assert order.config.routes == [] and typed.template.table.name == "_"
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.routes = ()  # type: ignore[misc]
    one = plan(_load([], **{"source.kafka.topics": ["x"]}))
    assert one.routes == () and [t.name for t in one.tables] == ["x"]
