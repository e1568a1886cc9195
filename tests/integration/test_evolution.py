"""Schema control: evolution policies, type widening, no type drift, file sizing.

Each test runs the real pipeline against the real broker, twice (before and after the
records change), and reads the table back with independent readers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from lakesink.local.services import produce
from tests.fixtures.services import config_dict, read_ids
from tests.integration.test_ingest import run_once

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

FORMATS = ["parquet", "delta"]
NARROW_SCHEMA = [
    {"name": "id", "type": "Int64"},
    {"name": "location", "type": "Utf8"},
    {"name": "ts_ms", "type": "Int64"},
    {"name": "count", "type": "Int32"},
    {"name": "ratio", "type": "Float32"},
]


def event(i: int, **fields: Any) -> tuple[bytes, bytes]:
    record = {"id": i, "location": ["oslo", "lima"][i % 2],
              "ts_ms": 1_795_000_000_000 + i * 60_000, "count": i, "ratio": 0.5, **fields}
    return str(i).encode(), json.dumps(record).encode()


def table_rows(table: Path, fmt: str, columns: list[str]) -> dict[int, dict[str, Any]]:
    """Rows by id as an independent reader sees them (delta-rs / DuckDB by name)."""
    if fmt == "delta":
        from deltalake import DeltaTable

        rows = DeltaTable(str(table)).to_pyarrow_table(columns=["id", *columns]).to_pylist()
    else:
        import duckdb

        rel = duckdb.sql(f"SELECT id, {', '.join(columns)} FROM read_parquet("
                         f"'{table}/**/*.parquet', hive_partitioning=true, union_by_name=true)")
        rows = [dict(zip(["id", *columns], r, strict=True)) for r in rel.fetchall()]
    assert len(rows) == len({r["id"] for r in rows}), "an id appears twice"
    return {r["id"]: r for r in rows}


def rejected(lake: Path) -> list[tuple[str, str, bytes]]:
    import duckdb

    if not list((lake / "_rejected").rglob("*.parquet")):
        return []
    return [(r[0], r[1], bytes(r[2])) for r in duckdb.sql(
        f"SELECT reason, detail, value FROM read_parquet('{lake}/_rejected/events/*.parquet')"
    ).fetchall()]


def stored_schema(lake: Path) -> dict[str, Any]:
    return json.loads((lake / ".lakesink/events/schema.json").read_text())


@pytest.mark.parametrize("fmt", FORMATS)
def test_add_columns_new_fields_become_columns(spark, kafka_broker, topic, tmp_path,
                                               fmt) -> None:
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format=fmt)
    data["decode"]["schema"] = NARROW_SCHEMA
    produce(kafka_broker.bootstrap_servers, topic, [event(i) for i in range(40)])
    first = run_once(spark, data)
    assert first.written == 40 and first.schema_changes == 0

    # new fields arrive (a string, a number, an object); old rows must read as NULL there
    produce(kafka_broker.bootstrap_servers, topic, [
        event(i, site=f"s{i}", depth=i * 2, meta={"fw": "1.2"}) for i in range(40, 80)])
    second = run_once(spark, data)
    assert second.written == 40 and second.rejected == 0
    rows = table_rows(lake / "events", fmt, ["site", "depth"])
    assert sorted(rows) == list(range(80))
    assert all(rows[i]["site"] is None and rows[i]["depth"] is None for i in range(40))
    assert all(rows[i]["site"] == f"s{i}" and rows[i]["depth"] == i * 2 for i in range(40, 80))

    record = stored_schema(lake)
    names = [f["name"] for f in record["schema"]["fields"]]
    assert names[:5] == [f["name"] for f in NARROW_SCHEMA]  # new columns go after
    assert sorted(names[5:]) == ["depth", "meta", "site"]
    assert record["version"] == 2
    assert "+ depth bigint" in record["history"][-1]["changes"]

    # Spark reads every file together (new columns NULL in the older files)
    reader = spark.read.format("delta") if fmt == "delta" else \
        spark.read.option("mergeSchema", "true")
    sdf = reader.load(str(lake / "events")) if fmt == "delta" else \
        reader.parquet(str(lake / "events"))
    assert sdf.count() == 80 and sdf.where("site IS NOT NULL").count() == 40
    assert sdf.where("meta.fw = '1.2'").count() == 40

    # a restart keeps the evolved schema (declared + added), nothing re-evolves
    produce(kafka_broker.bootstrap_servers, topic, [event(80, site="x", depth=1)])
    third = run_once(spark, data)
    assert third.written == 1 and third.schema_changes == 0
    assert stored_schema(lake)["version"] == 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_type_widening_and_other_type_changes(spark, kafka_broker, topic, tmp_path,
                                              fmt) -> None:
    """Parquet widens int -> bigint and float -> double by default. Delta does not by
    default (delta-rs cannot read the typeWidening table feature), so there the
    out-of-range values are rejected with the reason; a fraction in an integer column
    is never a widening."""
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format=fmt)
    data["decode"]["schema"] = NARROW_SCHEMA
    produce(kafka_broker.bootstrap_servers, topic, [event(i) for i in range(20)])
    run_once(spark, data)
    produce(kafka_broker.bootstrap_servers, topic, [
        event(20, count=3_000_000_000),      # overflows int
        event(21, ratio=1e300),              # overflows float
        event(22, count=2.5),                # not a widening: rejected either way
        event(23),
    ])
    stats = run_once(spark, data)
    rows = table_rows(lake / "events", fmt, ["count", "ratio"])
    bad = rejected(lake)
    assert [(r[0], json.loads(r[2])["id"]) for r in bad if json.loads(r[2])["id"] == 22] == [
        ("schema_mismatch", 22)]
    if fmt == "parquet":
        assert stats.written == 3 and stats.rejected == 1
        assert rows[20]["count"] == 3_000_000_000 and rows[21]["ratio"] == 1e300
        types = {f["name"]: f["type"] for f in stored_schema(lake)["schema"]["fields"]}
        assert types["count"] == "long" and types["ratio"] == "double"
        # old files keep int32/float, new files int64/double: readers unify by name
        newest = max((lake / "events").rglob("*.parquet"), key=lambda p: p.stat().st_mtime)
        assert str(pq.read_schema(newest).field("count").type) == "int64"
        sdf = spark.read.schema("id long, count long, ratio double").parquet(
            str(lake / "events"))
        assert sdf.count() == 23 and sdf.where("count = 3000000000").count() == 1
    else:
        assert stats.written == 1 and stats.rejected == 3
        assert sorted(rows) == [*range(20), 23]
        details = {json.loads(r[2])["id"]: r[1] for r in bad}
        assert details[20].startswith("count: expected int, got bigint")
        assert details[21].startswith("ratio: expected float, got double")


@pytest.mark.parametrize("fmt", FORMATS)
def test_strict_drop_reports_unknown_fields(spark, kafka_broker, topic, tmp_path,
                                            fmt) -> None:
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format=fmt, schema_evolution="strict")
    data["decode"]["schema"] = NARROW_SCHEMA
    produce(kafka_broker.bootstrap_servers, topic,
            [event(i, secret_extra=i) for i in range(10)] + [event(i) for i in range(10, 20)])
    stats = run_once(spark, data)
    assert stats.written == 20 and stats.rejected == 0 and stats.unknown_dropped == 10
    assert sorted(read_ids(lake / "events", fmt)) == list(range(20))
    assert "secret_extra" not in [f["name"] for f in stored_schema(lake)["schema"]["fields"]]
    if fmt == "parquet":  # what was dropped is recorded with the batch's commit
        manifests = [json.loads(p.read_text())
                     for p in (lake / ".lakesink/events/manifests").rglob("*.json")]
        dropped = [m["unknown_fields_dropped"] for m in manifests if "unknown_fields_dropped" in m]
        assert dropped == [{"records": 10, "names": ["secret_extra"]}]


@pytest.mark.parametrize("fmt", FORMATS)
def test_strict_reject_sends_records_with_unknown_fields_to_rejected(
        spark, kafka_broker, topic, tmp_path, fmt) -> None:
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format=fmt, schema_evolution="strict",
                       unknown_fields="reject")
    data["decode"]["schema"] = NARROW_SCHEMA
    produce(kafka_broker.bootstrap_servers, topic,
            [event(i, extra1=True) for i in range(5)] + [event(i) for i in range(5, 15)])
    stats = run_once(spark, data)
    assert stats.written == 10 and stats.rejected == 5
    assert sorted(read_ids(lake / "events", fmt)) == list(range(5, 15))
    bad = rejected(lake)
    assert {(r[0], r[1]) for r in bad} == {("unknown_field", "field(s) not in the schema: extra1")}
    assert sorted(json.loads(r[2])["id"] for r in bad) == list(range(5))


def test_no_type_drift_between_files(spark, kafka_broker, topic, tmp_path) -> None:
    """The Quix sink's bug: a column typed per batch. Here every file of the table has
    the table's type, whatever the JSON numbers in a batch look like."""
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake)
    del data["decode"]["schema"]  # inferred from the first records: value -> bigint
    data["decode"]["infer_wait_s"] = 10
    produce(kafka_broker.bootstrap_servers, topic,
            [event(i, value=i) for i in range(10)])
    run_once(spark, data)
    produce(kafka_broker.bootstrap_servers, topic,   # a batch of whole numbers and fractions
            [event(i, value=i) for i in range(10, 20)] + [event(20, value=2.5)])
    stats = run_once(spark, data)
    assert stats.written == 10 and stats.rejected == 1
    types = {str(pq.read_schema(p).field("value").type)
             for p in (lake / "events").rglob("*.parquet")}
    assert types == {"int64"}
    [(reason, detail, _)] = rejected(lake)
    assert reason == "schema_mismatch" and detail.startswith("value: expected bigint, got decimal")


@pytest.mark.parametrize("fmt", FORMATS)
def test_target_file_size_splits_a_partition_folder(spark, kafka_broker, topic, tmp_path,
                                                    fmt) -> None:
    """1 MiB target: the first batch (bytes per row still guessed) is cut into files of
    at most 1 MiB / 200 B = 5242 rows; every row is there once."""
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, format=fmt, target_file_size="1MiB",
                       partition_by=["location"])
    n = 24_000
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k", json.dumps({"id": i, "location": "oslo", "ts_ms": i, "value": i / 3})
              .encode()) for i in range(n)])
    stats = run_once(spark, data)
    assert stats.written == n
    files = list((lake / "events" / "location=oslo").glob("*.parquet"))
    counts = sorted(pq.ParquetFile(p).metadata.num_rows for p in files)
    assert len(files) >= 4 and max(counts) <= 1024 * 1024 // 200 and sum(counts) == n
    assert sorted(read_ids(lake / "events", fmt)) == list(range(n))


@pytest.mark.parametrize("count_colons", [True, False], ids=["java-counter", "split"])
def test_unknown_key_guard_matches_the_exact_parse(spark, count_colons: bool) -> None:
    """The colon-count guard that skips the second JSON parse never hides a key, with
    lakesink's Java colon counter (which the session must have) and with ``split``."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from lakesink.decode import json_decoder
    from lakesink.decode.json import COUNT_COLONS, JsonDecoder
    from lakesink.runtime.spark import has_function

    if count_colons:  # once: the session has the counter and the factory picks it
        assert has_function(spark, COUNT_COLONS)  # scripts/setup.sh built jvm/udf
        assert json_decoder(T.StructType([]), reject_unknown=False, spark=spark).count_colons
    decoder = JsonDecoder(T.StructType([T.StructField("location", T.StringType()),
                                        T.StructField("n", T.LongType())]),
                          count_colons=count_colons)
    values = [
        '{"location":"a","n":1}',             # known fields only: guard skips the parse
        '{"location" : "a" , "n" :1 }',       # whitespace around colons
        '{"Location":"a","n":1}',             # case variant: stays unknown
        '{"location":"a","n":1,"x":2}',       # one extra key
        '{"location":null,"n":1,"x":2}',      # null known field plus an extra key
        '{"n":1,"x":2}',                      # a known field absent, an extra present
        '{"location":"a:b","n":1,"x":2}',     # colon inside a string
        '{"location":"a","n":"z","x":2}',     # type mismatch plus an extra key
        '{"x":{"y":1}}',                      # nested object under an unknown key
        '{"location":"a","location":"b"}',    # duplicate key
        '{"location":"a","n":1,"x:y":{}}',    # a key containing a colon
        '{"location":"ä:ö","n":1,"é":2}',     # multi-byte characters around colons
        "not json", "[1,2]", "", "{}",
    ]
    df = spark.createDataFrame([(v.encode(),) for v in values] + [(None,)], "value binary")
    parsed = df.select("value", decoder.parse(F.col("value")).alias("_r"))
    rows = parsed.select(
        F.col("value").cast("string").alias("text"),
        decoder.unknown_keys(F.col("value"), F.col("_r")).alias("guarded"),
        decoder.unknown_keys(F.col("value")).alias("exact"),
    ).collect()
    assert len(rows) == len(values) + 1
    for row in rows:
        assert row["guarded"] == row["exact"], row["text"]
    by_text = {r["text"]: r["guarded"] for r in rows}
    assert by_text['{"location":"a","n":1}'] == []
    assert by_text['{"n":1,"x":2}'] == ["x"]
    assert by_text['{"location":"a","n":1,"x:y":{}}'] == ["x:y"]


def test_max_columns_caps_what_a_batch_adds_and_a_full_table_still_takes_known_records(
        spark, kafka_broker, topic, tmp_path) -> None:
    """``table.max_columns``: records that each fit may together pass the cap: the
    first new fields by name become columns, a record with one of the others is a dead
    letter (``too_many_fields``); then, the table full, records with only known fields
    are still written and any new field is refused."""
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, partition_by=[], max_columns=7)
    data["decode"] = {"schema": NARROW_SCHEMA}  # 5 fields: room for 2
    produce(kafka_broker.bootstrap_servers, topic,
            [event(0), event(1, a_new=1), event(2, b_new=2, c_new=3), event(3)])
    run_once(spark, data)
    produce(kafka_broker.bootstrap_servers, topic, [event(4), event(5, d_new=4)])
    run_once(spark, data)
    rows = table_rows(lake / "events", "parquet", ["a_new", "b_new"])
    dead = rejected(lake)
    print(f"max_columns: written {sorted(rows)}, rejected {[(r, d) for r, d, _ in dead]}")
    assert sorted(rows) == [0, 1, 3, 4] and rows[1]["a_new"] == 1
    assert sorted((r, json.loads(v)["id"]) for r, _, v in dead) == [
        ("too_many_fields", 2), ("too_many_fields", 5)]
