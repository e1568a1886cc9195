"""Avro through a real schema registry (Apicurio Registry, Confluent API), records
written by ``confluent_kafka``'s own ``AvroSerializer``: each record's writer schema is
looked up by id, newer schemas evolve the table, unknown ids and incompatible schemas go
to the rejected area with the id in the detail, and a registry that is down judges
nothing."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from lakesink.local.services import produce
from tests.integration.test_formats import raw_config, rejected
from tests.integration.test_ingest import run_once

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

V1 = {
    "type": "record", "name": "Reading", "namespace": "acme",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "location", "type": "string"},
        {"name": "amount", "type": "int"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
# a newer writer: a new optional field, and amount widened to long
V2 = copy.deepcopy(V1)
V2["fields"][2] = {"name": "amount", "type": "long"}
V2["fields"].append({"name": "note", "type": ["null", "string"], "default": None})
# an incompatible one: location became a number
V3 = copy.deepcopy(V1)
V3["fields"][1] = {"name": "location", "type": "int"}


def _serializer(url: str, schema: dict[str, Any]) -> Any:  # noqa: ANN401
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer

    client = SchemaRegistryClient({"url": url, "timeout": 60})
    return AvroSerializer(client, json.dumps(schema), conf={"auto.register.schemas": True})


def _value(serializer: Any, topic: str, record: dict[str, Any]) -> bytes:  # noqa: ANN401
    from confluent_kafka.serialization import MessageField, SerializationContext

    return serializer(record, SerializationContext(topic, MessageField.VALUE))


def _v1(i: int) -> dict[str, Any]:
    return {"id": i, "location": ["oslo", "lima"][i % 2], "amount": i * 10,
            "tags": [f"t{j}" for j in range(i % 3)]}


def _v2(i: int) -> dict[str, Any]:
    return {**_v1(i), "amount": 2**40 + i, "note": None if i % 4 == 0 else f"n{i}"}


def _registry_config(broker: Any, topic: str, lake: Path, url: str, **table: Any  # noqa: ANN401
                     ) -> dict[str, Any]:
    data = raw_config(broker, topic, lake, "avro", partition_by=["location"], **table)
    data["decode"]["avro"] = {"registry": {"url": url, "timeout_s": 5}}
    return data


def _schema_id(value: bytes) -> int:
    return struct.unpack(">I", value[1:5])[0]


def test_writer_schemas_from_the_registry_evolve_the_table(spark, kafka_broker, topic,
                                                          schema_registry, tmp_path) -> None:
    import duckdb

    from lakesink.errors import ConfigError

    url = schema_registry.url
    lake = tmp_path / "lake"
    data = _registry_config(kafka_broker, topic, lake, url)
    with pytest.raises(ConfigError, match=f"decode.avro.registry.subjects: none of "
                       f"\\['{topic}-value'\\]"):
        run_once(spark, data)  # nothing registered yet: no first schema
    s1, s2, s3 = (_serializer(url, v) for v in (V1, V2, V3))
    first = [(b"k", _value(s1, topic, _v1(i))) for i in range(40)]
    produce(kafka_broker.bootstrap_servers, topic, first)
    stats = run_once(spark, data)  # a new table: its first schema is <topic>-value's latest
    assert (stats.written, stats.rejected) == (40, 0)

    newer = [(b"k", _value(s2, topic, _v2(i))) for i in range(40, 100)]
    incompatible = _value(s3, topic, {**_v1(500), "location": 5})
    unknown = b"\x00" + struct.pack(">I", 987654) + newer[0][1][5:]
    truncated = newer[1][1][:7]
    produce(kafka_broker.bootstrap_servers, topic,
            newer + [(b"bad", v) for v in (incompatible, unknown, truncated, b"\x01abcd")]
            + [(b"tomb", None)])
    stats = run_once(spark, data)
    assert (stats.written, stats.rejected) == (60, 5)
    assert stats.schema_changes == 2  # + note, amount int -> bigint

    rows = duckdb.sql(f"SELECT id, location, amount, tags, note FROM read_parquet("
                      f"'{lake}/events/**/*.parquet', hive_partitioning=true, "
                      "union_by_name=true)").fetchall()
    assert sorted(r[0] for r in rows) == list(range(100))
    for id_, location, amount, tags, note in rows:
        want = _v1(id_) if id_ < 40 else _v2(id_)
        assert (location, amount, tags, note) == (
            want["location"], want["amount"], want["tags"], want.get("note"))
    # Spark reads the whole table with the schema lakesink stored (widened, evolved)
    from pyspark.sql import types as T

    stored = json.loads((lake / ".lakesink" / "events" / "schema.json").read_text())
    read = spark.read.schema(T.StructType.fromJson(stored["schema"])).parquet(
        str(lake / "events"))
    assert dict(read.dtypes)["amount"] == "bigint"
    assert sorted((r.id, r.amount) for r in read.collect()) == sorted(
        (r[0], r[2]) for r in rows)

    got = {reason: (detail, value) for reason, detail, value in rejected(lake)}
    assert sorted(got) == ["bad_magic_byte", "incompatible_schema", "malformed_avro",
                           "null_value", "unknown_schema_id"]
    detail, value = got["incompatible_schema"]
    assert value == incompatible and f"schema id {_schema_id(incompatible)}" in detail
    assert "'location' is int" in detail
    detail, value = got["unknown_schema_id"]
    assert value == unknown and "schema id 987654 is not in the registry" in detail
    assert got["malformed_avro"][1] == truncated
    assert stored["history"][0]["changes"][0].startswith("registry subject(s) " + topic)


def test_a_registry_that_is_down_judges_nothing(spark, kafka_broker, topic, schema_registry,
                                               tmp_path) -> None:
    """Records are neither written nor rejected while their schema cannot be looked up;
    once the registry answers, every record is written once."""
    import duckdb

    from lakesink.local.services import free_port

    url = schema_registry.url
    s1 = _serializer(url, V1)
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k", _value(s1, topic, _v1(i))) for i in range(30)])
    lake = tmp_path / "lake"
    schema_file = tmp_path / "v1.avsc"
    schema_file.write_text(json.dumps(V1))
    down = _registry_config(kafka_broker, topic, lake, f"http://127.0.0.1:{free_port()}")
    down["decode"]["avro"]["schema_file"] = str(schema_file)  # the start needs no registry
    down["retry"] = {"batch_attempts": 1, "restarts": 1, "initial_backoff_s": 0.1}
    with pytest.raises(Exception, match="schema registry .* unavailable"):
        run_once(spark, down)
    assert not list((lake / "events").rglob("*.parquet"))
    assert not (lake / "_rejected").exists() or not list((lake / "_rejected").rglob("*.parquet"))

    up = copy.deepcopy(down)
    up["decode"]["avro"]["registry"]["url"] = url
    stats = run_once(spark, up)
    assert (stats.written, stats.rejected) == (30, 0)
    ids = [r[0] for r in duckdb.sql(
        f"SELECT id FROM read_parquet('{lake}/events/**/*.parquet')").fetchall()]
    assert sorted(ids) == list(range(30))


def test_delta_table_follows_the_registry(spark, kafka_broker, topic, schema_registry,
                                          tmp_path) -> None:
    from deltalake import DeltaTable

    url = schema_registry.url
    v1 = copy.deepcopy(V1)
    v1["fields"][2] = {"name": "amount", "type": "long"}
    s1, s2 = _serializer(url, v1), _serializer(url, V2)
    produce(kafka_broker.bootstrap_servers, topic,
            [(b"k", _value(s1, topic, {**_v1(i), "amount": 2**40 + i})) for i in range(20)]
            + [(b"k", _value(s2, topic, _v2(i))) for i in range(20, 50)])
    lake = tmp_path / "lake"
    data = _registry_config(kafka_broker, topic, lake, url, format="delta")
    stats = run_once(spark, data)
    assert (stats.written, stats.rejected) == (50, 0)
    table = DeltaTable(str(lake / "events")).to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in table) == list(range(50))
    for r in table:
        assert r["amount"] == 2**40 + r["id"]
        assert r["note"] == (None if r["id"] < 20 else _v2(r["id"])["note"])
    assert spark.read.format("delta").load(str(lake / "events")).count() == 50


ALERT = {"type": "record", "name": "Alert", "namespace": "acme",
         "fields": [{"name": "id", "type": "long"}, {"name": "level", "type": "string"}]}


def produce_two_record_types(broker: Any, topic: str, registry_url: str,  # noqa: ANN401
                             extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """30 records, ids 0-29: ``acme.Alert`` for every third id, ``acme.Reading`` (V1)
    for the others, registered by record name (RecordNameStrategy); then ``extra``."""
    from confluent_kafka.schema_registry import SchemaRegistryClient, record_subject_name_strategy
    from confluent_kafka.schema_registry.avro import AvroSerializer

    client = SchemaRegistryClient({"url": registry_url, "timeout": 60})
    conf = {"auto.register.schemas": True,
            "subject.name.strategy": record_subject_name_strategy}
    readings = AvroSerializer(client, json.dumps(V1), conf=conf)
    alerts = AvroSerializer(client, json.dumps(ALERT), conf=conf)
    produce(broker.bootstrap_servers, topic,
            [(b"k", _value(readings, topic, _v1(i)) if i % 3 else
              _value(alerts, topic, {"id": i, "level": f"l{i}"})) for i in range(30)]
            + list(extra))


def test_routing_by_avro_record_name(spark, kafka_broker, topic, schema_registry,
                                     tmp_path) -> None:
    """One topic, two record types (the serializers' RecordNameStrategy): each record
    name gets its table with that record's columns; an unknown id is unrouted."""
    import duckdb

    from tests.integration.test_routing import _unrouted

    produce_two_record_types(kafka_broker, topic, schema_registry.url,
                             ((b"k", b"\x00" + struct.pack(">I", 424242) + b"\x02"),))
    lake = tmp_path / "lake"
    data = raw_config(kafka_broker, topic, lake, "avro", partition_by=[])
    data["decode"]["avro"] = {"registry": {"url": schema_registry.url}}
    data["table"].pop("name")
    data["routes"] = [{"topics": [topic], "message_type": {"record_name": True,
                                                           "table_prefix": "t_"}}]
    stats = run_once(spark, data)
    assert (stats.written, stats.rejected) == (30, 1)

    def table(name: str) -> list[tuple[Any, ...]]:
        return duckdb.sql(f"SELECT * FROM read_parquet('{lake}/{name}/**/*.parquet') "
                          "ORDER BY id").fetchall()

    assert table("t_acme.Alert") == [(i, f"l{i}") for i in range(0, 30, 3)]
    got = table("t_acme.Reading")
    assert [r[0] for r in got] == [i for i in range(30) if i % 3]
    assert all(r[1:] == (_v1(r[0])["location"], _v1(r[0])["amount"], _v1(r[0])["tags"])
               for r in got)
    unrouted = _unrouted(lake)
    assert len(unrouted) == 1 and unrouted[0][3].startswith("no Avro record name")


PROTO_V1 = """syntax = "proto3";
package acme;
import "google/protobuf/timestamp.proto";
message Reading {
  int64 id = 1;
  string location = 2;
  int32 amount = 3;
  repeated string tags = 4;
  google.protobuf.Timestamp at = 5;
}
"""
# a newer writer: amount widened to int64 (the same wire type), a new optional field
PROTO_V2 = PROTO_V1.replace("int32 amount = 3;", "int64 amount = 3;").replace(
    "google.protobuf.Timestamp at = 5;", "google.protobuf.Timestamp at = 5;\n"
    "  optional string note = 6;")
# an incompatible one: location became a number
PROTO_V3 = PROTO_V1.replace("string location = 2;", "int32 location = 2;")


def _message_class(tmp_path: Path, name: str, text: str) -> Any:  # noqa: ANN401
    """acme.Reading of ``text``, in its own descriptor pool (versions coexist)."""
    from pathlib import Path as P

    import grpc_tools
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from grpc_tools import protoc

    folder = tmp_path / name
    folder.mkdir()
    (folder / "reading.proto").write_text(text)
    include = str(P(grpc_tools.__file__).parent / "_proto")
    out = folder / "set.desc"
    assert protoc.main(["protoc", f"-I{folder}", f"-I{include}", "--include_imports",
                        f"--descriptor_set_out={out}", "reading.proto"]) == 0
    pool = descriptor_pool.DescriptorPool()
    for proto in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.Reading"))


def test_protobuf_writer_schemas_from_the_registry(spark, kafka_broker, topic, schema_registry,
                                                   tmp_path) -> None:
    """Protobuf through the registry, written by confluent_kafka's ProtobufSerializer
    (which registers serialized descriptors; Apicurio returns them as given)."""
    import datetime as dt

    import duckdb
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    client = SchemaRegistryClient({"url": schema_registry.url, "timeout": 60})
    conf = {"use.deprecated.format": False, "auto.register.schemas": True}
    classes = [_message_class(tmp_path, f"v{i}", t)
               for i, t in enumerate((PROTO_V1, PROTO_V2, PROTO_V3), 1)]
    ser = [ProtobufSerializer(c, client, conf) for c in classes]
    at = dt.datetime(2026, 11, 29, 8, 0, tzinfo=dt.UTC)

    def reading(version: int, i: int) -> Any:  # noqa: ANN401
        cls = classes[version - 1]
        msg = cls(id=i, location=["oslo", "lima"][i % 2], amount=i * 10 if version == 1
                  else 2**40 + i, tags=[f"t{j}" for j in range(i % 3)])
        msg.at.FromDatetime(at + dt.timedelta(seconds=i))
        if version == 2 and i % 4:
            msg.note = f"n{i}"
        return msg

    def value(version: int, msg: Any) -> bytes:  # noqa: ANN401
        from confluent_kafka.serialization import MessageField, SerializationContext

        return ser[version - 1](msg, SerializationContext(topic, MessageField.VALUE))

    v1 = [(b"k", value(1, reading(1, i))) for i in range(30)]
    produce(kafka_broker.bootstrap_servers, topic, v1)
    lake = tmp_path / "lake"
    data = raw_config(kafka_broker, topic, lake, "protobuf", partition_by=["location"])
    data["decode"]["protobuf"] = {"message": "acme.Reading",
                                  "registry": {"url": schema_registry.url}}
    stats = run_once(spark, data)  # the table starts from <topic>-value's latest: v1
    assert (stats.written, stats.rejected) == (30, 0)
    v2 = [(b"k", value(2, reading(2, i))) for i in range(30, 60)]
    incompatible = value(3, classes[2](id=99, location=5))
    unknown = b"\x00" + struct.pack(">I", 555555) + v1[0][1][5:]
    garbage = v2[0][1][:6] + b"\xff\xff\xff"
    produce(kafka_broker.bootstrap_servers, topic,
            v2 + [(b"bad", v) for v in (incompatible, unknown, garbage)]
            + [(b"tomb", None)])
    stats = run_once(spark, data)
    assert (stats.written, stats.rejected, stats.schema_changes) == (30, 4, 2)

    rows = duckdb.sql(f"SELECT id, location, amount, tags, \"at\", note FROM read_parquet("
                      f"'{lake}/events/**/*.parquet', hive_partitioning=true, "
                      "union_by_name=true) ORDER BY id").fetchall()
    assert [r[0] for r in rows] == list(range(60))
    for id_, location, amount, tags, at_, note in rows:
        want = reading(1 if id_ < 30 else 2, id_)
        assert (location, amount, tags) == (want.location, want.amount, list(want.tags))
        assert at_.replace(tzinfo=dt.UTC) == at + dt.timedelta(seconds=id_)
        assert note == (want.note if id_ >= 30 and want.HasField("note") else None)
    got = {reason: (detail, value) for reason, detail, value in rejected(lake)}
    assert sorted(got) == ["incompatible_schema", "malformed_protobuf", "null_value",
                           "unknown_schema_id"]
    assert "'location' is int" in got["incompatible_schema"][0]
    assert "schema id 555555 is not in the registry" in got["unknown_schema_id"][0]
    assert got["malformed_protobuf"][1] == garbage
