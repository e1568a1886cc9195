"""Kafka -> Parquet with the real broker and Spark, read back by DuckDB, pyarrow and Spark."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pyarrow.dataset as pads
import pytest

from lakesink.app import Pipeline
from lakesink.config import load_config
from lakesink.errors import ConfigError, LayoutError
from lakesink.pipeline.partitioning import partition_path, time_parts, to_utc
from lakesink.local.services import produce
from tests.fixtures.runs import flatten, run_once
from tests.fixtures.services import (
    ENGINE,
    config_dict,
    duckdb_ids,
    json_events,
    produce_events,
)

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


BAD_RECORDS = [
    (b"k", b"this is not json", "malformed_json"),
    (b"k", b'{"id": "seven", "location": "oslo", "ts_ms": 1795000000000}', "schema_mismatch"),
    (b"k", b"[1, 2, 3]", "not_an_object"),
    (b"k", b'{"id": 1, "location": "oslo", "ts_ms": "yesterday"}', "schema_mismatch"),
    (b"k", None, "null_value"),
    (b"k", b"", "malformed_json"),
]


def test_every_record_once_partitions_and_rejects(spark, kafka_broker, topic, tmp_path) -> None:
    n = 3000
    produce_events(kafka_broker, topic, range(n))
    produce(kafka_broker.bootstrap_servers, topic, [(k, v) for k, v, _ in BAD_RECORDS])
    lake = tmp_path / "lake"
    stats = run_once(spark, config_dict(kafka_broker, topic, lake))

    table = lake / "events"
    ids = duckdb_ids(table)
    assert len(ids) == n, "rows lost or duplicated"
    assert sorted(ids) == list(range(n))
    assert stats.written == n and stats.rejected == len(BAD_RECORDS)

    # folders are exactly the Hive paths the reference implementation predicts
    expected_dirs = set()
    for _, value in json_events(range(n)):
        event = json.loads(value)
        parts = {"location": event["location"], **time_parts(to_utc(event["ts_ms"]))}
        expected_dirs.add(partition_path(parts, ["location", "year", "month", "day"]))
    actual_dirs = {str(p.parent.relative_to(table)) for p in table.rglob("*.parquet")}
    assert actual_dirs == expected_dirs
    # one new file per partition folder per batch (the Arrow path: one per task, i.e.
    # per Kafka partition of the batch), deterministic names
    names = [p.name for p in table.rglob("*.parquet")]
    if ENGINE == "spark":
        assert len(names) == len(expected_dirs) * stats.batches
    else:
        assert len(expected_dirs) <= len(names) <= len(expected_dirs) * stats.batches * 2
    assert all(name.startswith("part-") for name in names)
    # no staging, bookkeeping or rejected file inside the table folder
    assert not [p for p in table.rglob("*") if p.is_file() and not p.name.endswith(".parquet")
                and not p.name.endswith(".crc")]

    # the rejected area: raw bytes, reason, coordinates
    import duckdb

    rejected = duckdb.sql(
        f"SELECT value, reason, detail, topic, partition, \"offset\" FROM "
        f"read_parquet('{lake}/_rejected/events/*.parquet')").fetchall()
    assert Counter(r[1] for r in rejected) == Counter(reason for *_, reason in BAD_RECORDS)
    assert {bytes(r[0]) if r[0] is not None else None for r in rejected} == {
        v for _, v, _ in BAD_RECORDS}
    assert all(r[3] == topic and r[5] >= 0 for r in rejected)
    assert {r[2] for r in rejected if r[1] == "schema_mismatch"} == {
        'id: expected bigint, got string "seven"',
        'ts_ms: expected bigint, got string "yesterday"'}

    # independent readers agree: pyarrow and Spark see the same rows
    dataset = pads.dataset(str(table), format="parquet", partitioning="hive")
    assert dataset.count_rows() == n
    sdf = spark.read.parquet(str(table))
    assert sdf.count() == n
    assert sdf.select("id").distinct().count() == n
    assert set(sdf.columns) >= {"id", "location", "ts_ms", "value", "year", "month", "day"}


def test_text_timestamps_and_invalid_ones(spark, kafka_broker, topic, tmp_path) -> None:
    stamps = {0: "2026-11-25T07:05:09Z", 1: "1795590309123", 2: "2026-11-25 23:59:59",
              3: "yesterday", 4: None}
    records = [(b"k", json.dumps({"id": i, "ts": ts}).encode()) for i, ts in stamps.items()]
    produce(kafka_broker.bootstrap_servers, topic, records)
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, partition_by=["day", "hour"],
                       timestamp_column="ts")
    data["decode"]["schema"] = [{"name": "id", "type": "Int64"}, {"name": "ts", "type": "Utf8"}]
    stats = run_once(spark, data)
    assert stats.written == 4 and stats.rejected == 1
    dirs = sorted({str(p.parent.relative_to(lake / "events"))
                   for p in (lake / "events").rglob("*.parquet")})
    assert dirs == ["day=25/hour=07", "day=25/hour=23",
                    "day=__HIVE_DEFAULT_PARTITION__/hour=__HIVE_DEFAULT_PARTITION__"]
    import duckdb

    (reason, detail), = duckdb.sql(
        f"SELECT reason, detail FROM read_parquet('{lake}/_rejected/events/*.parquet')"
    ).fetchall()
    assert reason == "invalid_timestamp" and "yesterday" in detail


def test_null_in_a_required_field_rejects_only_that_record(spark, kafka_broker, topic,
                                                           tmp_path) -> None:
    records = [{"id": 1, "location": "oslo"}, {"location": "oslo"}, {"id": None, "location": "x"},
               {"id": 4, "location": None}]
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k", json.dumps(r).encode()) for r in records])
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake, partition_by=[], timestamp_column=None)
    data["decode"]["schema"] = [{"name": "id", "type": "Int64", "nullable": False},
                                {"name": "location", "type": "Utf8"}]
    stats = run_once(spark, data)
    assert (stats.written, stats.rejected) == (2, 2)
    assert sorted(duckdb_ids(lake / "events")) == [1, 4]
    import duckdb

    rejected = duckdb.sql(f"SELECT reason, detail FROM "
                          f"read_parquet('{lake}/_rejected/events/*.parquet')").fetchall()
    assert rejected == [("missing_required", "required field(s) without a value: id")] * 2


@pytest.mark.parametrize("null_value", ["__HIVE_DEFAULT_PARTITION__", "__None__"])
def test_nasty_partition_values_stay_in_their_folder(spark, kafka_broker, topic, tmp_path,
                                                     null_value) -> None:
    values = ["a/b", "k=v", "..", "../../escape", "50%", None, "", "späti", "x:y"]
    hive_null = "__HIVE_DEFAULT_PARTITION__"  # a literal value: what readers take for NULL
    records = [(b"k", json.dumps({"id": i, "location": v, "ts_ms": 1795000000000}).encode())
               for i, v in enumerate([*values, hive_null])]
    produce(kafka_broker.bootstrap_servers, topic, records)
    lake = tmp_path / "lake"
    stats = run_once(spark, config_dict(kafka_broker, topic, lake, partition_by=["location"],
                                        null_partition_value=null_value))
    if null_value == hive_null:  # the table's own NULL folder: it lands there, as NULL
        values.append(hive_null)
        assert stats.rejected == 0
    else:  # it would come back NULL beside this table's NULL folder: rejected, said why
        import duckdb

        assert stats.rejected == 1
        assert duckdb.sql(f"SELECT reason, detail FROM read_parquet('{lake}/_rejected/"
                          "events/*.parquet')").fetchall() == [(
                              "invalid_partition_value", "location: the value is "
                              f"{hive_null}, which readers take for NULL (this table's "
                              "NULL folder is '__None__')")]
    table = lake / "events"
    files = list(table.rglob("*.parquet"))
    assert all(f.resolve().is_relative_to(table.resolve()) for f in files)
    dirs = {str(f.parent.relative_to(table)) for f in files}
    expected = {partition_path({"location": v}, ["location"], null_value=null_value)
                for v in values}
    assert dirs == expected
    # Spark reads the escaped values back as the originals; null and "" share the null
    # folder, which Spark reads as NULL (Hive's default) or as the custom literal
    got = {r.location for r in spark.read.parquet(str(table)).select("location").collect()}
    null_read = None if null_value == "__HIVE_DEFAULT_PARTITION__" else null_value
    assert got == {v if v and v != hive_null else null_read for v in values}


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_base_path_with_space_percent_and_accent(spark, kafka_broker, topic, tmp_path,
                                                 fmt) -> None:
    """The table lands in the folder the user named: Hadoop reads a ``file:`` URI
    literally (``%20`` stays ``%20``), so lakesink must not percent-encode local paths,
    nor decode them when it lists the staged files it publishes."""
    n = 500
    produce_events(kafka_broker, topic, range(n))
    produce(kafka_broker.bootstrap_servers, topic, [(b"k", b"not json")])
    lake = tmp_path / "my lake 50% é"
    stats = run_once(spark, {**config_dict(kafka_broker, topic, lake), "table": {
        **config_dict(kafka_broker, topic, lake)["table"], "format": fmt}})
    table = lake / "events"
    assert stats.written == n and stats.rejected == 1
    assert sorted(duckdb_ids(table)) == list(range(n)), "rows lost or duplicated"
    rejected = pads.dataset(str(lake / "_rejected" / "events"), format="parquet")
    assert rejected.to_table(columns=["value"]).column("value").to_pylist() == [b"not json"]
    # nothing written under an encoded twin of the path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my lake 50% é"]
    assert (lake / ".lakesink").is_dir()  # checkpoint and bookkeeping beside the table


def test_spark_timestamp_rules_match_reference(spark) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from lakesink.pipeline.partitioning import time_part_exprs, timestamp_column_expr

    numbers = [0, 59, 1795590309, 99_999_999_999, 100_000_000_000, 1795590309123,
               1795590309123456, 1795590309123456789, -1795590309123]
    strings = ["1795590309123", "2026-11-25T07:05:09Z", "2026-11-25T23:30:00-02:00",
               "2026-01-02 03:04:05", "2026-11-25T07:05:09.123456Z"]
    for values, dtype in ((numbers, T.LongType()), (strings, T.StringType())):
        df = spark.createDataFrame([(v,) for v in values],
                                   T.StructType([T.StructField("v", dtype)]))
        ts = timestamp_column_expr(F.col("v"), dtype)
        parts = time_part_exprs(ts)
        rows = df.select("v", *[parts[k].alias(k) for k in ("year", "month", "day", "hour")]
                         ).collect()
        for row in rows:
            assert row.asDict() == {"v": row.v, **time_parts(to_utc(row.v))}, row


def test_schema_inferred_once_and_stored(spark, kafka_broker, topic, tmp_path) -> None:
    produce_events(kafka_broker, topic, range(100))
    lake = tmp_path / "lake"
    data = config_dict(kafka_broker, topic, lake)
    del data["decode"]
    run_once(spark, data)
    stored = json.loads((lake / ".lakesink" / "events" / "schema.json").read_text())
    assert {f["name"]: f["type"] for f in stored["schema"]["fields"]} == {
        "id": "long", "location": "string", "ts_ms": "long", "value": "double"}
    # later records carry a new field: the stored schema still decides how they decode
    produce_events(kafka_broker, topic, range(100, 150), extra_field="surprise")
    run_once(spark, data)
    assert sorted(duckdb_ids(lake / "events")) == list(range(150))
    import duckdb

    cols = [c[0] for c in duckdb.sql(
        f"DESCRIBE SELECT * FROM read_parquet('{lake}/events/**/*.parquet')").fetchall()]
    assert "extra_field" not in cols


def test_partition_change_is_refused_before_data_moves(spark, kafka_broker, topic, tmp_path
                                                       ) -> None:
    produce_events(kafka_broker, topic, range(10))
    lake = tmp_path / "lake"
    run_once(spark, config_dict(kafka_broker, topic, lake))
    before = sorted(p.name for p in (lake / "events").rglob("*.parquet"))
    produce_events(kafka_broker, topic, range(10, 20))
    with pytest.raises(LayoutError) as info:
        run_once(spark, config_dict(kafka_broker, topic, lake, partition_by=["year", "location"]))
    assert info.value.key == "table.partition_by"
    assert "['location', 'year', 'month', 'day']" in str(info.value)
    assert sorted(p.name for p in (lake / "events").rglob("*.parquet")) == before


def test_unknown_partition_column_is_a_config_error(spark, kafka_broker, topic, tmp_path
                                                    ) -> None:
    with pytest.raises(ConfigError) as info:
        run_once(spark, config_dict(kafka_broker, topic, tmp_path / "lake",
                                    partition_by=["nope"]))
    assert info.value.key == "table.partition_by"


def test_a_start_setting_changed_before_the_first_commit_is_refused(
        spark, kafka_broker, topic, tmp_path, caplog) -> None:
    """known-open L6: a first start from ``latest`` whose first batch never reached
    Spark's commit log (a crash), then corrected to ``earliest``: Spark kept the first
    start and the correction silently read nothing. Now it is refused, naming the key;
    set back, the checkpoint runs on from where it started. After a commit the change is
    only said (Spark reads on from its logs)."""
    produce_events(kafka_broker, topic, range(10))
    data = config_dict(kafka_broker, topic, tmp_path / "lake")
    data["source"]["kafka"]["starting_offsets"] = "latest"
    assert run_once(spark, data).written == 0  # an empty batch 0 at the topic's end
    commits = tmp_path / "lake" / ".lakesink" / "events" / "checkpoint" / "commits"
    for entry in commits.iterdir():  # the first batch never reached the commit log
        entry.unlink()
    data["source"]["kafka"]["starting_offsets"] = "earliest"
    with pytest.raises(ConfigError) as refused:
        run_once(spark, data)
    assert refused.value.key == "source.kafka.starting_offsets"
    assert "'latest'" in str(refused.value)
    data["source"]["kafka"]["starting_offsets"] = "latest"
    produce_events(kafka_broker, topic, range(10, 15))
    assert run_once(spark, data).written == 5
    data["source"]["kafka"]["starting_offsets"] = "earliest"
    with caplog.at_level("WARNING", logger="lakesink.tables.identity"):
        assert run_once(spark, data).written == 0
    assert "source.kafka.starting_offsets" in caplog.text and "ignored" in caplog.text


def test_a_short_run_cancels_the_workers_warm_up(spark, kafka_broker, topic, tmp_path,
                                                 monkeypatch, caplog) -> None:
    """A caught-up run can end before the Python workers' warm-up (started beside the
    query): a restart with nothing to read does. The run cancels the warm-up's job
    instead of waiting for it, and says so in one line, not as a failure."""
    import logging

    from lakesink.pipeline import arrow_path

    cfg = load_config(flags=flatten(config_dict(kafka_broker, topic, tmp_path / "lake")),
                      env={})
    real = arrow_path._warm

    def slow(spec: Any, batches: Any) -> Any:  # in the worker: far longer than the run
        import time

        time.sleep(120)
        yield from real(spec, batches)

    monkeypatch.setattr(arrow_path, "_warm", slow)
    assert arrow_path.pinned_threads()  # PySpark's default: the job is tagged
    pipeline = Pipeline.build(cfg, spark)
    with caplog.at_level(logging.INFO, logger="lakesink"):
        stats = pipeline.run(until_caught_up=True)  # nothing to read yet
    assert stats.records == 0
    assert pipeline.warm_up is not None, "no warm-up started for the Arrow path"
    assert not pipeline.warm_up.is_alive()
    messages = [r.getMessage() for r in caplog.records]
    assert any("warm-up was cancelled: the run ended first" in m for m in messages), messages
    assert not any("warmed up in" in m or "still running" in m for m in messages), messages
    assert not any("warming up" in m and "failed" in m for m in messages), messages
    # the session's later jobs are not tagged: the next run's batches and warm-up run
    monkeypatch.setattr(arrow_path, "_warm", real)
    produce_events(kafka_broker, topic, range(5))
    again = Pipeline.build(cfg, spark)
    assert again.run(until_caught_up=True).written == 5
    assert sorted(duckdb_ids(tmp_path / "lake" / "events")) == list(range(5))
