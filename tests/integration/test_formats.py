"""Every payload format end to end: the real broker, the real pipeline, read back by an
independent reader (DuckDB for Parquet, delta-rs for Delta); bad values land in the
rejected area with their raw bytes and a reason, and the stream goes on."""

from __future__ import annotations

import base64
import io
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from lakesink.runtime.services import produce
from tests.fixtures.services import config_dict
from tests.integration.test_ingest import run_once

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

AVRO_SCHEMA = {
    "type": "record", "name": "Reading", "namespace": "acme",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "location", "type": "string"},
        {"name": "ts_ms", "type": "long"},
        {"name": "ratio", "type": ["null", "double"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}


def raw_config(broker, topic: str, lake: Path, fmt: str, **table: Any) -> dict[str, Any]:  # noqa: ANN001
    data = config_dict(broker, topic, lake, **{"partition_by": [], "timestamp_column": None,
                                               **table})
    data["decode"] = {"format": fmt}
    return data


def rejected(lake: Path) -> list[tuple[str, str, bytes | None]]:
    """(reason, detail, raw value) of every rejected record; a tombstone's value is None."""
    import duckdb

    return [(r[0], r[1], None if r[2] is None else bytes(r[2])) for r in duckdb.sql(
        f"SELECT reason, detail, value FROM read_parquet('{lake}/_rejected/events/*.parquet')"
    ).fetchall()]


def parquet_rows(lake: Path, columns: str) -> list[tuple[Any, ...]]:
    import duckdb

    return duckdb.sql(f"SELECT {columns} FROM read_parquet('{lake}/events/**/*.parquet', "
                      "hive_partitioning=true)").fetchall()


def test_string_format(spark, kafka_broker, topic, tmp_path) -> None:
    lake = tmp_path / "lake"
    good = [f"line {i} ✓".encode() for i in range(30)] + [b""]
    bad = [(b"k1", b"\xff\xfe not utf-8"), (b"k2", None)]
    produce(kafka_broker.bootstrap_servers, topic, [(b"k", v) for v in good] + bad)
    stats = run_once(spark, raw_config(kafka_broker, topic, lake, "string"))
    assert (stats.written, stats.rejected) == (31, 2)
    rows = sorted(r[0] for r in parquet_rows(lake, "data"))
    assert rows == sorted(v.decode() for v in good)
    assert sorted((r[0], r[2]) for r in rejected(lake)) == [
        ("invalid_utf8", b"\xff\xfe not utf-8"), ("null_value", None)]


def test_int64_format(spark, kafka_broker, topic, tmp_path) -> None:
    lake = tmp_path / "lake"
    numbers = [0, 1, -1, 2**63 - 1, -(2**63), 1_795_000_000_000, -42]
    values = [struct.pack(">q", n) for n in numbers]
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k", v) for v in values] + [(b"k", b"\x00" * 7), (b"k", b"\x01" * 9)])
    stats = run_once(spark, raw_config(kafka_broker, topic, lake, "int64"))
    assert (stats.written, stats.rejected) == (len(numbers), 2)
    assert sorted(r[0] for r in parquet_rows(lake, "value")) == sorted(numbers)
    bad = rejected(lake)
    assert {r[0] for r in bad} == {"invalid_length"}
    assert sorted(r[1] for r in bad) == ["expected 8 bytes (big-endian int64), got 7",
                                         "expected 8 bytes (big-endian int64), got 9"]


def test_bytes_format_to_delta(spark, kafka_broker, topic, tmp_path) -> None:
    from deltalake import DeltaTable

    lake = tmp_path / "lake"
    values = [bytes(range(i % 256)) * (1 + i % 3) for i in range(40)] + [b""]
    produce(kafka_broker.bootstrap_servers, topic, [(b"k", v) for v in values] + [(b"k", None)])
    stats = run_once(spark, raw_config(kafka_broker, topic, lake, "bytes", format="delta"))
    assert (stats.written, stats.rejected) == (len(values), 1)
    rows = DeltaTable(str(lake / "events")).to_pyarrow_table().to_pylist()
    got = sorted((base64.b64decode(r["data"]), r["size"]) for r in rows)
    assert got == sorted((v, len(v)) for v in values)


def _avro(record: dict[str, Any]) -> bytes:
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO_SCHEMA), record)
    return out.getvalue()


def _reading(i: int) -> dict[str, Any]:
    return {"id": i, "location": ["oslo", "lima"][i % 2], "ts_ms": 1_795_000_000_000 + i * 3_600_000,
            "ratio": None if i % 5 == 0 else i / 4, "tags": [f"t{j}" for j in range(i % 3)]}


@pytest.mark.parametrize("wire", ["plain", "confluent"])
def test_avro_format(spark, kafka_broker, topic, tmp_path, wire) -> None:
    lake = tmp_path / "lake"
    schema_file = tmp_path / "reading.avsc"
    schema_file.write_text(json.dumps(AVRO_SCHEMA))
    frame = b"\x00" + struct.pack(">i", 7) if wire == "confluent" else b""
    good = [_reading(i) for i in range(60)]
    bad = [frame + b"", frame + b"\x02"]  # no datum; a datum cut off after the id
    if wire == "confluent":
        bad.append(b"\x01" + struct.pack(">i", 7) + _avro(_reading(99)))  # wrong magic byte
    produce(kafka_broker.bootstrap_servers, topic,
            [(str(r["id"]).encode(), frame + _avro(r)) for r in good]
            + [(b"bad", v) for v in bad] + [(b"tomb", None)])
    data = raw_config(kafka_broker, topic, lake, "avro",
                      partition_by=["location", "year", "month", "day"], timestamp_column="ts_ms")
    data["decode"]["avro"] = {"schema_file": str(schema_file), "wire": wire}
    stats = run_once(spark, data)
    assert (stats.written, stats.rejected) == (60, len(bad) + 1)
    rows = parquet_rows(lake, "id, location, ts_ms, ratio, tags, year, day")
    assert len(rows) == 60 and len({r[0] for r in rows}) == 60
    for r in rows:
        want = _reading(r[0])
        assert (r[1], r[2], r[3], r[4]) == (want["location"], want["ts_ms"], want["ratio"],
                                            want["tags"])
        assert r[5] == 2026
    reasons = sorted(r[0] for r in rejected(lake))
    expected = ["malformed_avro", "malformed_avro", "null_value"]
    assert reasons == sorted(expected + (["bad_magic_byte"] if wire == "confluent" else []))
    assert sorted(b"<none>" if r[2] is None else r[2] for r in rejected(lake)) == sorted(bad + [b"<none>"])


def test_avro_schema_file_problems_are_config_errors(tmp_path) -> None:
    from lakesink.config import load_config
    from lakesink.app import preflight
    from lakesink.errors import ConfigError

    base = {"source.kafka.bootstrap_servers": "127.0.0.1:9", "source.kafka.topics": ["t"],
            "decode.format": "avro"}
    with pytest.raises(ConfigError) as missing:
        load_config(flags=base, env={})
    assert missing.value.key == "decode.avro.schema_file"
    enum_schema = tmp_path / "e.avsc"
    enum_schema.write_text(json.dumps({"type": "enum", "name": "E", "symbols": ["A"]}))
    cfg = load_config(flags={**base, "decode.avro.schema_file": str(enum_schema)}, env={})
    with pytest.raises(ConfigError, match="must be a record") as not_record:
        preflight(cfg)
    assert not_record.value.key == "decode.avro.schema_file"
