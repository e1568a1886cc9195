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

from lakesink.local.services import produce
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


def test_ten_percent_garbage_every_record_accounted_per_partition(spark, kafka_broker, topic,
                                                                  tmp_path) -> None:
    """JSON with 10 % bad records of every kind mixed in, over several batches: per Kafka
    partition, rows in the table + rejected records = records produced."""
    import random

    from pyspark.sql import functions as F

    from tests.fixtures.services import json_events

    rng = random.Random(5)
    kinds = [b"{not json", b"[1, 2, 3]", b'{"id": "seven", "location": "x", "ts_ms": 1}',
             b'{"id": 1000000, "location": "x", "ts_ms": "yesterday"}', None, b"\xff\xfe\x00"]
    records: list[tuple[bytes, bytes | None]] = []
    for key, value in json_events(range(1800)):
        records.append((key, value))
        if rng.random() < 0.1:
            records.append((f"g{len(records)}".encode(), rng.choice(kinds)))
    produced = produce(kafka_broker.bootstrap_servers, topic, records)
    data = config_dict(kafka_broker, topic, tmp_path / "lake")
    data["source"]["kafka"]["max_offsets_per_trigger"] = 500
    stats = run_once(spark, data)
    assert stats.batches >= 4
    assert stats.written + stats.rejected == produced

    # where each record went, by an independent read of the topic
    topic_rows = (spark.read.format("kafka")
                  .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
                  .option("subscribe", topic).option("startingOffsets", "earliest").load()
                  .select("partition", F.get_json_object(F.col("value").cast("string"), "$.id")
                          .alias("id")).collect())
    partition_of_id = {int(r["id"]): r["partition"] for r in topic_rows
                       if r["id"] is not None and r["id"].isdigit()}
    produced_per_partition: dict[int, int] = {}
    for r in topic_rows:
        produced_per_partition[r["partition"]] = produced_per_partition.get(r["partition"], 0) + 1
    table_ids = [r[0] for r in parquet_rows(tmp_path / "lake", "id")]
    assert len(table_ids) == len(set(table_ids)) == 1800
    import duckdb

    rejected_per_partition = dict(duckdb.sql(
        f"SELECT partition, count(*) FROM read_parquet('{tmp_path}/lake/_rejected/events/*.parquet')"
        " GROUP BY partition").fetchall())
    for p, count in produced_per_partition.items():
        rows = sum(1 for i in table_ids if partition_of_id[i] == p)
        assert rows + rejected_per_partition.get(p, 0) == count, p


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_key_and_metadata_columns(spark, kafka_broker, topic, tmp_path, fmt) -> None:
    """``table.key_column`` (Quix's ``__key``) and ``table.metadata_column`` (the Danube
    sink's metadata) hold each record's own key, topic, partition and offset."""
    import duckdb
    from deltalake import DeltaTable

    from tests.fixtures.services import json_events

    lake = tmp_path / "lake"
    records = json_events(range(50))
    records = [(b"\xffbin" if i == 7 else f"sensor-{i}".encode(), v)
               for i, (_, v) in enumerate(records)]
    produce(kafka_broker.bootstrap_servers, topic, records)
    data = config_dict(kafka_broker, topic, lake, format=fmt, key_column="__key",
                       metadata_column="_kafka")
    stats = run_once(spark, data)
    assert stats.written == 50
    if fmt == "delta":
        rows = DeltaTable(str(lake / "events")).to_pyarrow_table(
            columns=["id", "__key", "_kafka"]).to_pylist()
    else:
        rows = [dict(zip(["id", "__key", "_kafka"], r, strict=True)) for r in duckdb.sql(
            f"SELECT id, __key, _kafka FROM read_parquet('{lake}/events/**/*.parquet')"
        ).fetchall()]
    assert len(rows) == 50
    # where Kafka put each record, read independently of lakesink
    placed = {(r["partition"], r["offset"]): json.loads(r["value"])["id"] for r in (
        spark.read.format("kafka").option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
        .option("subscribe", topic).option("startingOffsets", "earliest").load()
        .selectExpr("partition", "offset", "cast(value as string) AS value").collect())}
    for r in rows:
        want_key = "\ufffdbin" if r["id"] == 7 else f"sensor-{r['id']}"
        assert r["__key"] == want_key
        meta = r["_kafka"]
        assert meta["topic"] == topic and meta["timestamp"] is not None
        assert placed[(meta["partition"], meta["offset"])] == r["id"]


PROTO = """
syntax = "proto3";
package acme;
import "google/protobuf/timestamp.proto";

message Reading {
  enum Kind { UNKNOWN = 0; A = 1; B = 2; }
  message Inner { int32 x = 1; }
  int64 id = 1;
  string location = 2;
  google.protobuf.Timestamp at = 3;
  optional double ratio = 4;
  repeated string tags = 5;
  map<string, int32> counts = 6;
  Kind kind = 7;
  uint64 big = 8;
  Inner inner = 9;
  bytes blob = 10;
}

message Other { string s = 1; }
"""


def _compile_proto(tmp_path: Path) -> tuple[Path, Any]:
    """protoc (grpcio-tools): the descriptor set lakesink reads, and the generated Python
    module the test produces with (an independent path to the same bytes)."""
    import importlib
    import sys

    import grpc_tools
    from grpc_tools import protoc

    (tmp_path / "reading.proto").write_text(PROTO)
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    desc = tmp_path / "reading.desc"
    assert protoc.main(["protoc", f"-I{tmp_path}", f"-I{include}", "--include_imports",
                        f"--descriptor_set_out={desc}", f"--python_out={tmp_path}",
                        "reading.proto"]) == 0
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("reading_pb2")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("reading_pb2", None)
    return desc, module


@pytest.mark.parametrize("wire", ["plain", "confluent"])
def test_protobuf_format(spark, kafka_broker, topic, tmp_path, wire) -> None:
    import datetime as dt

    desc, pb = _compile_proto(tmp_path)
    lake = tmp_path / "lake"
    frame = (b"\x00" + struct.pack(">i", 3) + b"\x00") if wire == "confluent" else b""
    messages = []
    for i in range(50):
        m = pb.Reading(id=i, location=["oslo", "lima"][i % 2], tags=[f"t{j}" for j in range(i % 3)],
                       kind=i % 3, big=2**64 - 1 - i, blob=bytes([i, 0, 255]))
        m.at.FromMilliseconds(1_795_000_000_000 + i * 1000)
        if i % 4:
            m.ratio = i / 4
        if i % 5:
            m.inner.x = -i
        m.counts.update({"a": i, "b": 2 * i} if i % 2 else {})
        messages.append(m)
    bad = [frame + b"\xff\xff\xff", frame + b"\x0a\x05ab"]  # not protobuf; a cut-off field
    if wire == "confluent":
        bad += [b"\x01" + frame[1:] + messages[0].SerializeToString(),  # wrong magic byte
                b"\x00" + struct.pack(">i", 3) + b"\x02\x02" + b"\x0a\x01x"]  # index [1]: Other
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k", frame + m.SerializeToString()) for m in messages] + [(b"k", v) for v in bad])
    data = raw_config(kafka_broker, topic, lake, "protobuf")
    data["decode"]["protobuf"] = {"descriptor_file": str(desc), "message": "acme.Reading",
                                  "wire": wire}
    stats = run_once(spark, data)
    assert (stats.written, stats.rejected) == (50, len(bad))
    import duckdb

    columns = 'id, location, "at", ratio, tags, counts, kind, big, "inner", blob'
    rows = duckdb.sql(f"SELECT {columns} FROM read_parquet('{lake}/events/**/*.parquet') "
                      "ORDER BY id").fetchall()
    assert len(rows) == 50
    for m, r in zip(messages, rows, strict=True):
        assert r[0] == m.id and r[1] == m.location
        assert r[2] == dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(
            milliseconds=m.at.ToMilliseconds())
        assert r[3] == (m.ratio if m.HasField("ratio") else None)
        assert r[4] == list(m.tags)
        assert dict(r[5]) == dict(m.counts)
        assert r[6] == pb.Reading.Kind.Name(m.kind)
        assert int(r[7]) == m.big
        assert r[8] == ({"x": m.inner.x} if m.HasField("inner") else None)
        assert bytes(r[9]) == m.blob
    reasons = sorted(r[0] for r in rejected(lake))
    want = ["malformed_protobuf"] * 2 + (["bad_magic_byte", "malformed_protobuf"]
                                         if wire == "confluent" else [])
    assert reasons == sorted(want)


def _ipc(*batches: Any, schema: Any = None) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema if schema is not None else batches[0].schema) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


def test_arrow_ipc_format_to_delta(spark, kafka_broker, topic, tmp_path) -> None:
    """Each value is an IPC stream of one or more batches: every row of every good stream
    lands once (read by delta-rs); bad streams are one dead letter each."""
    import datetime as dt

    import pyarrow as pa
    from deltalake import DeltaTable

    lake = tmp_path / "lake"
    expected = []
    values = []
    next_id = 0
    for i in range(30):
        batches = []
        for _ in range(1 + i % 3):  # 1 to 3 record batches per message
            n = i % 4 + 1
            ids = list(range(next_id, next_id + n))
            next_id += n
            at = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=k) for k in ids]
            cols = {"id": pa.array(ids, pa.int64()), "name": pa.array([f"n{k}" for k in ids]),
                    "at": pa.array(at, pa.timestamp("ms", tz="UTC"))}
            if i % 5 == 0:
                cols["extra"] = pa.array([1.0] * n)  # not declared: ignored
            batches.append(pa.RecordBatch.from_pydict(cols))
            expected += [(k, f"n{k}", at[j]) for j, k in enumerate(ids)]
        values.append(_ipc(*batches))
    empty = pa.schema([("id", pa.int64())])
    values.append(_ipc(schema=empty))  # a stream with no rows: nothing to write
    narrow = _ipc(pa.RecordBatch.from_pydict({"id": pa.array([1, 2], pa.int64()),
                                              "name": pa.array([5, 6], pa.int32())}))
    overflow = _ipc(pa.RecordBatch.from_pydict({"id": pa.array([2**40], pa.int64()),
                                                "count": pa.array([2**40], pa.int64())}))
    bad = [b"not arrow at all", values[0][:40], overflow]
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k", v) for v in values + [narrow] + bad])
    data = raw_config(kafka_broker, topic, lake, "arrow_ipc", format="delta")
    data["decode"]["schema"] = "id bigint, name string, at timestamp, count int"
    stats = run_once(spark, data)
    assert stats.rejected == len(bad)
    rows = DeltaTable(str(lake / "events")).to_pyarrow_table().to_pylist()
    got = sorted((r["id"], r["name"], r["at"]) for r in rows if r["name"] not in ("5", "6"))
    assert got == sorted(expected)
    assert sorted((r["id"], r["name"]) for r in rows if r["name"] in ("5", "6")) == [
        (1, "5"), (2, "6")]  # int32 -> string is a safe cast
    assert len(rows) == len(expected) + 2
    reasons = sorted(r[0] for r in rejected(lake))
    assert reasons == ["malformed_arrow", "malformed_arrow", "schema_mismatch"]


def test_parquet_dictionary_encoding_learned_from_the_first_batch(spark, tmp_path) -> None:
    """Columns whose dictionary Parquet abandoned in a batch (too many distinct values)
    are written without a dictionary attempt from the next batch on; columns that kept
    theirs keep it, and every row reads back (pyarrow footers, DuckDB)."""
    import duckdb
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    from lakesink.tables.layout import TableLayout
    from lakesink.tables.parquet import ParquetTableWriter

    layout = TableLayout.of(str(tmp_path / "lake"), "events")
    writer = ParquetTableWriter(spark, layout, app_id="d" * 32, partition_by=["kind"])
    writer.prepare()

    def batch(start: int) -> Any:  # noqa: ANN401
        return (spark.range(start, start + 60_000, numPartitions=1)
                .select(F.col("id"), (F.col("id") * 7919 % 1_000_003).alias("spread"),
                        (F.col("id") % 3).cast("string").alias("kind"),
                        (F.col("id") % 5).alias("level")))

    assert "parquet.enable.dictionary#id" not in writer.write_options()
    writer.write_batch(0, batch(0))
    assert {"id", "spread"} <= writer.no_dictionary
    assert "level" not in writer.no_dictionary
    options = writer.write_options()
    assert options["parquet.enable.dictionary#id"] == "false"
    assert "parquet.enable.dictionary#level" not in options

    reads = []
    footers = writer.fs.parquet_dictionary_columns
    writer.fs.parquet_dictionary_columns = lambda path: reads.append(path) or footers(path)
    writer.write_batch(1, batch(60_000))
    assert reads == []  # after a verdict, footers are read only every RELEARN_EVERY batches
    second = sorted((tmp_path / "lake" / "events").rglob("part-0000000001-*.parquet"))
    assert second
    for path in second:
        columns = pq.ParquetFile(path).metadata.row_group(0)
        kept = {columns.column(i).path_in_schema: columns.column(i).has_dictionary_page
                for i in range(columns.num_columns)}
        # id/spread: Parquet would abandon their dictionaries anyway (that is the verdict
        # learned); the check that matters is that level keeps its dictionary
        assert kept == {"id": False, "spread": False, "level": True}
    con = duckdb.connect()
    rows = con.execute(
        "SELECT count(*), count(DISTINCT id), sum(level) FROM read_parquet(?, "
        "hive_partitioning = true)", [str(tmp_path / "lake" / "events" / "**" / "*.parquet")]
    ).fetchone()
    assert rows == (120_000, 120_000, sum(i % 5 for i in range(120_000)))
