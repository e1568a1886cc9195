"""Routing: several topics of one stream into several tables, each with its own format,
partitions, decoder and transforms; records of a topic no route takes are dead letters
(reason ``unrouted``) or dropped. Read back by DuckDB and delta-rs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from lakesink.local.services import produce
from tests.fixtures.services import config_dict, json_events
from tests.integration.test_ingest import run_once

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _topics(kafka_broker, topic: str) -> dict[str, str]:  # noqa: ANN001
    names = {k: f"{topic}-{k}" for k in ("orders", "clicks-eu", "clicks-us", "raw", "other")}
    for name in names.values():
        kafka_broker.create_topic(name, partitions=2)
    return names


def _routed_config(kafka_broker, topic: str, lake: Path, names: dict[str, str],  # noqa: ANN001
                   **top: Any) -> dict[str, Any]:
    data = config_dict(kafka_broker, topic, lake, partition_by=[], timestamp_column=None)
    data["source"]["kafka"]["topics"] = []
    data["source"]["kafka"]["topic_pattern"] = re.escape(topic) + "-.*"
    data["table"].pop("name")
    data["routes"] = [
        {"topics": [names["orders"]],
         "table": {"name": "orders", "partition_by": ["location", "day"],
                   "timestamp_column": "ts_ms"}},
        {"topics": [names["clicks-eu"], names["clicks-us"]],
         "table": {"name": "clicks", "format": "delta", "transforms": ["region: kafka.topic"]}},
        {"topic_pattern": re.escape(names["raw"]) + "(-v[0-9]+)?",
         "table": {"name": "raw"}, "decode": {"format": "string"}},
    ]
    data.update(top)
    return data


def _unrouted(lake: Path) -> list[tuple[Any, ...]]:
    import duckdb

    files = list((lake / "_rejected" / "_unrouted").glob("*.parquet"))
    if not files:
        return []
    return duckdb.sql("SELECT reason, stage, topic, detail, value FROM read_parquet("
                      f"'{lake}/_rejected/_unrouted/*.parquet')").fetchall()


def test_topics_to_tables_each_with_its_own_settings(spark, kafka_broker, topic,
                                                      tmp_path) -> None:
    import duckdb
    from deltalake import DeltaTable

    lake = tmp_path / "lake"
    names = _topics(kafka_broker, topic)
    bootstrap = kafka_broker.bootstrap_servers
    produce(bootstrap, names["orders"], json_events(range(0, 40)))
    produce(bootstrap, names["clicks-eu"], json_events(range(100, 125)))
    produce(bootstrap, names["clicks-us"], json_events(range(200, 215)))
    produce(bootstrap, names["raw"], [(b"k", f"line {i}".encode()) for i in range(12)])
    other = [(b"k", f"other {i}".encode()) for i in range(6)]
    produce(bootstrap, names["other"], other)

    stats = run_once(spark, _routed_config(kafka_broker, topic, lake, names))
    assert (stats.written, stats.rejected) == (40 + 40 + 12, 6)

    orders = duckdb.sql(f"SELECT id, location, day FROM read_parquet('{lake}/orders/**/*.parquet',"
                        " hive_partitioning=true)").fetchall()
    assert sorted(r[0] for r in orders) == list(range(40))
    assert {p.name.split("=")[0] for p in (lake / "orders").iterdir()} == {"location"}
    clicks = DeltaTable(str(lake / "clicks")).to_pyarrow_table(columns=["id", "region"])
    by_id = dict(zip(clicks["id"].to_pylist(), clicks["region"].to_pylist(), strict=True))
    assert sorted(by_id) == list(range(100, 125)) + list(range(200, 215))
    assert all(by_id[i] == names["clicks-eu" if i < 200 else "clicks-us"] for i in by_id)
    raw = duckdb.sql(f"SELECT data FROM read_parquet('{lake}/raw/**/*.parquet')").fetchall()
    assert sorted(r[0] for r in raw) == sorted(f"line {i}" for i in range(12))

    bad = _unrouted(lake)
    assert sorted(bytes(r[4]) for r in bad) == sorted(v for _, v in other)
    assert {(r[0], r[1], r[2]) for r in bad} == {("unrouted", "route", names["other"])}
    assert not (lake / "_rejected" / "orders").exists()  # each table's own area stays clean


def test_unrouted_drop_and_a_restart_adds_nothing_twice(spark, kafka_broker, topic,
                                                        tmp_path) -> None:
    import duckdb

    lake = tmp_path / "lake"
    names = _topics(kafka_broker, topic)
    bootstrap = kafka_broker.bootstrap_servers
    produce(bootstrap, names["orders"], json_events(range(0, 20)))
    produce(bootstrap, names["other"], [(b"k", b'{"id": 1}')] * 5)
    data = _routed_config(kafka_broker, topic, lake, names, unrouted="drop")
    first = run_once(spark, data)
    assert (first.written, first.rejected) == (20, 0)
    produce(bootstrap, names["orders"], json_events(range(20, 30)))
    produce(bootstrap, names["clicks-us"], json_events(range(200, 203)))
    second = run_once(spark, data)
    assert (second.written, second.rejected) == (13, 0)
    ids = duckdb.sql(f"SELECT id FROM read_parquet('{lake}/orders/**/*.parquet')").fetchall()
    assert sorted(r[0] for r in ids) == list(range(30))
    assert _unrouted(lake) == []
    assert json.loads((lake / ".lakesink" / "_routes" / "checkpoint" / "lakesink.json")
                      .read_text())["app_id"]


def test_route_errors_name_the_route(spark, kafka_broker, topic, tmp_path) -> None:
    from lakesink.errors import ConfigError

    names = _topics(kafka_broker, topic)
    data = _routed_config(kafka_broker, topic, tmp_path / "lake", names)
    data["routes"][1]["table"]["partition_by"] = ["nope"]
    with pytest.raises(ConfigError) as err:
        run_once(spark, data)
    assert err.value.key == "routes.1.table.partition_by"


def _typed(i: int, kind: str | None) -> tuple[bytes, bytes]:
    record: dict[str, Any] = {"id": i, "ts_ms": 1_795_000_000_000 + i * 3_600_000}
    if kind is not None:
        record["type"] = kind
    if kind == "order":
        record["amount"] = i * 1.5
    elif kind == "click":
        record["url"] = f"/p/{i}"
    elif kind == "view":
        record["page"], record["ms"] = f"/v/{i}", i * 10
    return (b"k", json.dumps(record).encode())


def test_message_type_routing_creates_a_table_per_allowed_type(spark, kafka_broker, topic,
                                                               tmp_path) -> None:
    """A field names the table; each type's table gets its own schema on first sight; the
    allow-list and records without the field go to the unrouted dead letters; a later run
    adds a new type and appends to the known ones, nothing twice."""
    import duckdb

    lake = tmp_path / "lake"
    bootstrap = kafka_broker.bootstrap_servers
    kinds = ["order", "click", "admin", None]
    first = [_typed(i, kinds[i % 4]) for i in range(40)]
    produce(bootstrap, topic, first)
    data = config_dict(kafka_broker, topic, lake, partition_by=["day"])
    data.pop("decode")
    data["table"].pop("name")
    data["routes"] = [{"topics": [topic], "message_type": {
        "field": "type", "allow": "order|click|view", "table_prefix": "ev_"}}]
    one = run_once(spark, data)
    assert (one.written, one.rejected) == (20, 20)

    # the next run lets every type through, but makes at most 3 tables (audit-2 #10): a
    # third type still gets one, a fourth new type and a type too long to name a table
    # are dead letters, and the stream goes on
    second = [_typed(i, ["order", "view"][i % 2]) for i in range(40, 50)]
    hostile = [_typed(50, "zzz"), _typed(51, "a" * 300)]
    produce(bootstrap, topic, second + hostile)
    data["routes"][0]["message_type"].pop("allow")
    data["routes"][0]["message_type"]["max_tables"] = 3
    two = run_once(spark, data)
    assert (two.written, two.rejected) == (10, 2)

    def table(name: str, columns: str) -> list[tuple[Any, ...]]:
        return duckdb.sql(f"SELECT {columns} FROM read_parquet('{lake}/{name}/**/*.parquet', "
                          "hive_partitioning=true) ORDER BY id").fetchall()

    orders = table("ev_order", "id, amount")
    assert orders == [(i, i * 1.5) for i in [*range(0, 40, 4), *range(40, 50, 2)]]
    assert table("ev_click", "id, url") == [(i, f"/p/{i}") for i in range(1, 40, 4)]
    assert table("ev_view", "id, page, ms") == [(i, f"/v/{i}", i * 10) for i in range(41, 50, 2)]
    order_columns = {c[0] for c in duckdb.sql(
        f"DESCRIBE SELECT * FROM read_parquet('{lake}/ev_order/**/*.parquet')").fetchall()}
    assert order_columns == {"id", "ts_ms", "type", "amount", "day"}  # its own schema
    assert not (lake / "ev_admin").exists()

    bad = _unrouted(lake)
    details = sorted({r[3] for r in bad})
    assert details == ["message type 'admin' not allowed by routes.0.message_type.allow",
                       "message type 'zzz': the route has made 3 tables "
                       "(routes.0.message_type.max_tables)",
                       "message type of 300 characters: its table name would be over 128",
                       "no message type field 'type'"]
    assert sorted(json.loads(bytes(r[4]))["id"] for r in bad) == [
        *(i for i in range(40) if i % 4 in (2, 3)), 50, 51]
    assert not (lake / "ev_zzz").exists()


class _Registry:
    """A registry stand-in that names each id as told (the routing's bookkeeping is
    under test here, not the registry client)."""

    def __init__(self, names: dict[int, str]) -> None:
        from lakesink.decode.registry import WriterSchema

        self.known = {i: WriterSchema(i, "AVRO", json.dumps(
            {"type": "record", "name": n.rsplit(".", 1)[1], "namespace": n.rsplit(".", 1)[0],
             "fields": []})) for i, n in names.items()}

    def lookup(self, ids: list[int]) -> None:
        pass


def test_record_names_two_writers_lose_no_entry_and_the_first_wins(spark, tmp_path) -> None:
    """Two writers on one routed checkpoint (a stale one about to lose its lease): each
    id's type is written once; neither drops the other's ids, and a later type for the
    same id does not replace the recorded one."""
    from lakesink.pipeline.routing import RecordNameType
    from lakesink.tables.fs import HadoopFS

    root = f"file://{tmp_path}/cp/routes/record_names_0"
    (tmp_path / "cp" / "routes").mkdir(parents=True)
    (tmp_path / "cp" / "routes" / "record_names_0.json").write_text(
        json.dumps({"7": "acme.Old"}))  # the single file of an earlier version
    fs = HadoopFS(spark, root)
    first = RecordNameType(_Registry({1: "acme.A", 3: "acme.C"}), fs, root)
    stale = RecordNameType(_Registry({1: "acme.Changed", 2: "acme.B"}), fs, root)
    assert first.names == stale.names == {7: "acme.Old"}
    import struct

    def batch(i: int):  # noqa: ANN202 - a batch with one record of schema id i
        return spark.createDataFrame([(bytearray(b"\x00" + struct.pack(">I", i) + b"\x02"),)],
                                     "value binary")

    for n, (typer, i) in enumerate(((first, 1), (stale, 1), (stale, 2), (first, 3))):
        typer.column(batch(i), n)
    assert stale.names[1] == "acme.A", "the recorded type wins over a later lookup"
    again = RecordNameType(_Registry({}), fs, root)
    assert again.names == {7: "acme.Old", 1: "acme.A", 2: "acme.B", 3: "acme.C"}

    # audit-2 #9: an id the registry does not know yet (a lagging replica) is a miss of
    # that batch only: its replay routes it the same way, later batches ask again
    def kind_of(typer, i: int, batch_id: int):  # noqa: ANN001, ANN202
        return batch(i).select(typer.column(batch(i), batch_id)).first()[0]

    lagging = RecordNameType(_Registry({}), fs, root)
    assert kind_of(lagging, 9, 10) is None  # unrouted in batch 10
    caught_up = RecordNameType(_Registry({9: "acme.Late"}), fs, root)  # a restart
    assert 9 not in caught_up.names
    assert kind_of(caught_up, 9, 10) is None, "a replay of batch 10 routes as it did"
    assert kind_of(caught_up, 9, 11) == "acme.Late", "a later batch asks again"


class _TypeTable:
    """A message type's table stand-in: keeps the ids it is given per batch (its commit)
    or dies before committing (``crash``); the routing's bookkeeping is under test."""

    def __init__(self, name: str, held: dict[str, dict[int, list[int]]], crash: bool) -> None:
        from types import SimpleNamespace

        from lakesink.pipeline.batch import RunStats

        self.name, self.held, self.crash = name, held, crash
        self.writer = SimpleNamespace(is_committed=lambda b: b in held.get(name, {}))
        self.stats = RunStats()

    def __call__(self, df, batch_id: int) -> None:  # noqa: ANN001
        from pyspark.sql import functions as F

        if self.crash:
            raise RuntimeError(f"{self.name}: killed before its commit")
        self.held.setdefault(self.name, {})[batch_id] = sorted(int(r[0]) for r in df.select(
            F.get_json_object(F.col("value").cast("string"), "$.id")).collect())

    def close(self) -> None:
        pass


def _type_router(spark, checkpoint: Path, held: dict, refuse: set[str],  # noqa: ANN001
                 crash: set[str] = frozenset()) -> Any:  # noqa: ANN401
    """A routed checkpoint's router as a start builds it: one message-type route whose
    factory refuses the types in ``refuse`` (a set-up's ConfigError)."""
    from lakesink.errors import ConfigError
    from lakesink.pipeline.routing import JsonFieldType, Route, RoutePlans, Router, TypeTables
    from lakesink.tables.fs import HadoopFS

    def factory(name: str, samples: Any) -> _TypeTable:  # noqa: ANN401
        if name.removeprefix("ev_") in refuse:
            raise ConfigError("table.decode.schema", "no column could be inferred")
        return _TypeTable(name, held, name.removeprefix("ev_") in crash)

    types = TypeTables(typer=JsonFieldType("type"), allow=None, prefix="ev_",
                       factory=factory, reserved=set(), sample_size=10,
                       key="routes.0.message_type")
    plans = RoutePlans(HadoopFS(spark, str(checkpoint)), f"{checkpoint}/routes", "fp")
    return Router([Route(topics=["t"], pattern=None, types=types)], None, app_id="app",
                  plans=plans)


def test_a_replay_routes_each_type_as_the_first_attempt_did(spark, tmp_path) -> None:
    """audit-2 #19: a type's table set-up may decide differently on a replay (a schema
    inferred from a sample, a catalog's refusal): refused first and accepted on the
    replay put its records in its table and in the unrouted dead letters; accepted first
    and refused on the replay put them nowhere. The first attempt's decision is recorded
    with the batch and followed."""
    from lakesink.errors import SinkError

    rows = [("t", json.dumps({"id": i, "type": "ab"[i % 2]}).encode()) for i in range(10)]
    df = spark.createDataFrame(rows, "topic string, value binary")

    # refused in the first attempt (which committed type a's table), accepted now
    held: dict[str, dict[int, list[int]]] = {}
    _type_router(spark, tmp_path / "one", held, refuse={"b"})(df, 0)
    assert held == {"ev_a": {0: [0, 2, 4, 6, 8]}}
    _type_router(spark, tmp_path / "one", held, refuse=set())(df, 0)
    assert "ev_b" not in held  # b's records stay with the unrouted, as first decided
    _type_router(spark, tmp_path / "one", held, refuse=set())(df, 1)  # a new batch: b in
    assert held["ev_b"] == {1: [1, 3, 5, 7, 9]}

    # given a table in the first attempt (killed before that table committed), refused now
    held = {}
    with pytest.raises(RuntimeError, match="killed"):
        _type_router(spark, tmp_path / "two", held, refuse=set(), crash={"b"})(df, 0)
    with pytest.raises(SinkError, match="'b' went to table ev_b in the batch's first"):
        _type_router(spark, tmp_path / "two", held, refuse={"b"})(df, 0)
    _type_router(spark, tmp_path / "two", held, refuse=set())(df, 0)  # mended: finished
    assert held == {"ev_a": {0: [0, 2, 4, 6, 8]}, "ev_b": {0: [1, 3, 5, 7, 9]}}
