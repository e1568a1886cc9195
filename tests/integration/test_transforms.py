"""Transforms end to end: Spark SQL and kafka-delta-ingest strings over the real broker's
records, read back by DuckDB / delta-rs; a transform that raises for one record sends
that record to the rejected area (stage ``transform``) and the stream goes on."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.services import config_dict
from tests.integration.test_ingest import run_once

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

SCHEMA = [
    {"name": "id", "type": "Int64"},
    {"name": "location", "type": "Utf8"},
    {"name": "ts_ms", "type": "Int64"},
    {"name": "modified", "type": "Utf8"},
    {"name": "n", "type": "Utf8"},
]
TRANSFORMS = [
    "date: substr(modified, `0`, `10`)",  # kafka-delta-ingest's README example
    "meta.kafka.offset: kafka.offset",
    "meta.kafka.partition: kafka.partition",
    "meta.kafka.topic: kafka.topic",
    "iso: epoch_millis_to_iso8601(ts_ms)",
    "doubled: cast(n AS INT) * 2",  # ANSI: raises for a non-number
    "sensor: cast(kafka.key AS STRING)",
    "trace: cast(element_at(map_from_entries(kafka.headers), 'trace') AS STRING)",
    "location: upper(location)",  # replaces a payload field
]
BAD_N = {5, 17, 33}


def _records(count: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        ts = 1_795_000_000_000 + i * 7_200_123
        modified = dt.datetime.fromtimestamp(ts / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        out.append({"id": i, "location": ["oslo", "lima"][i % 2], "ts_ms": ts,
                    "modified": modified, "n": "x" if i in BAD_N else str(i)})
    return out


def _produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for r in records:
        producer.produce(topic, key=f"sensor-{r['id']}".encode(), value=json.dumps(r).encode(),
                         headers=[("trace", f"t-{r['id']}".encode())])
    assert producer.flush(30) == 0


def _placed(spark, bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:  # noqa: ANN001
    """id -> (partition, offset), read from the topic independently of lakesink."""
    rows = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").load()
            .selectExpr("partition", "offset", "cast(value as string) AS value").collect())
    return {json.loads(r["value"])["id"]: (r["partition"], r["offset"]) for r in rows}


def _iso(ts_ms: int) -> str:
    t = dt.datetime.fromtimestamp(ts_ms / 1000, dt.UTC)
    frac = f".{ts_ms % 1000:03d}" if ts_ms % 1000 else ""
    return t.strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_transforms_end_to_end(spark, kafka_broker, topic, tmp_path: Path, fmt: str) -> None:
    import duckdb
    from deltalake import DeltaTable

    lake = tmp_path / "lake"
    records = _records(60)
    _produce(kafka_broker.bootstrap_servers, topic, records)
    data = config_dict(kafka_broker, topic, lake, format=fmt, partition_by=["date"],
                       timestamp_column=None, transforms=TRANSFORMS)
    data["decode"] = {"schema": SCHEMA}
    stats = run_once(spark, data)
    assert (stats.written, stats.rejected) == (60 - len(BAD_N), len(BAD_N))

    columns = ["id", "location", "date", "meta", "iso", "doubled", "sensor", "trace"]
    if fmt == "delta":
        table = DeltaTable(str(lake / "events"))
        assert table.metadata().partition_columns == ["date"]
        rows = table.to_pyarrow_table(columns=columns).to_pylist()
    else:
        rows = [dict(zip(columns, r, strict=True)) for r in duckdb.sql(
            f"SELECT {', '.join(columns)} FROM read_parquet('{lake}/events/**/*.parquet', "
            "hive_partitioning=true)").fetchall()]
    placed = _placed(spark, kafka_broker.bootstrap_servers, topic)
    by_id = {r["id"]: r for r in rows}
    assert len(rows) == len(by_id) == 60 - len(BAD_N)
    for rec in records:
        if rec["id"] in BAD_N:
            assert rec["id"] not in by_id
            continue
        got = by_id[rec["id"]]
        partition, offset = placed[rec["id"]]
        assert str(got["date"]) == rec["modified"][:10]
        assert got["meta"] == {"kafka": {"offset": offset, "partition": partition,
                                         "topic": topic}}
        assert got["iso"] == _iso(rec["ts_ms"])
        assert got["doubled"] == 2 * int(rec["n"])
        assert got["sensor"] == f"sensor-{rec['id']}"
        assert got["trace"] == f"t-{rec['id']}"
        assert got["location"] == rec["location"].upper()

    bad = duckdb.sql(
        f"SELECT reason, stage, detail, value FROM read_parquet('{lake}/_rejected/events/*.parquet')"
    ).fetchall()
    assert sorted(json.loads(bytes(r[3]))["id"] for r in bad) == sorted(BAD_N)
    assert {(r[0], r[1]) for r in bad} == {("transform_failed", "transform")}
    assert {r[2] for r in bad} == {"transform 5 (doubled: cast(n AS INT) * 2) raised an error"}


def test_transform_that_does_not_resolve_fails_at_start(spark, kafka_broker, topic,
                                                         tmp_path: Path) -> None:
    from lakesink.errors import ConfigError

    data = config_dict(kafka_broker, topic, tmp_path / "lake", partition_by=[],
                       timestamp_column=None, transforms=["a: id + 1", "b: no_such_field * 2"])
    with pytest.raises(ConfigError) as err:
        run_once(spark, data)
    assert err.value.key == "table.transforms.1"
    assert "no_such_field" in err.value.message
