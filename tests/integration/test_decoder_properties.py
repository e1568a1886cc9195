"""Property tests (hypothesis): random bytes and random JSON into every decoder.

Every input ends as exactly one table row or exactly one rejected record (with its raw
bytes and a reason the decoder documents); no input is lost, none counted twice, and no
input makes the batch fail. Runs the batch function's own decode on the session's Spark
(no broker: the property is about decoding; the broker path is in test_formats.py).
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakesink.decode.evolution import EvolutionPolicy
from lakesink.pipeline.marker import Marker
from lakesink.pipeline.marks import INVALID_TIMESTAMP
from lakesink.pipeline.columns import PartitionSpec

pytestmark = [pytest.mark.integration, pytest.mark.spark]

JSON_SCHEMA = "id bigint, name string, ts_ms bigint, ratio float"
AVRO_REQUIRED = {"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "ratio", "type": ["null", "float"], "default": None}]}
AVRO_NULLABLE = {"type": "record", "name": "N", "fields": [
    {"name": "a", "type": ["null", "long"], "default": None},
    {"name": "b", "type": ["null", "string"], "default": None}]}

scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
           | st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=6)
field_values = st.one_of(scalars, json_values, st.integers(min_value=-2**70, max_value=2**70))
json_records = st.fixed_dictionaries(
    {}, optional={"id": field_values, "name": field_values, "ts_ms": field_values,
                  "ratio": field_values, "extra": json_values})


def _avro(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


avro_required = st.builds(
    lambda i, n, r: _avro(AVRO_REQUIRED, {"id": i, "name": n, "ratio": r}),
    st.integers(min_value=-2**63, max_value=2**63 - 1), st.text(max_size=8),
    st.none() | st.floats(width=32, allow_nan=False))
avro_nullable = st.builds(lambda a, b: _avro(AVRO_NULLABLE, {"a": a, "b": b}),
                          st.none() | st.integers(min_value=-2**63, max_value=2**63 - 1),
                          st.none() | st.text(max_size=8))
garbage = st.binary(max_size=48)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _pb(i: int, name: str) -> bytes:
    """message P {int64 id = 1; string name = 2;}, encoded by hand (the protobuf wire
    format), independently of the runtime the decoder uses."""
    text = name.encode()
    return b"\x08" + _varint(i) + b"\x12" + _varint(len(text)) + text


def _ipc_stream(rows: list[tuple[int, str]]) -> bytes:
    import pyarrow as pa

    batch = pa.RecordBatch.from_pydict({"id": pa.array([r[0] for r in rows], pa.int64()),
                                        "name": pa.array([r[1] for r in rows], pa.string())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


ipc_streams = st.lists(st.tuples(st.integers(min_value=-2**63, max_value=2**63 - 1),
                                 st.text(max_size=6)), min_size=1, max_size=4).map(_ipc_stream)
protobuf_messages = st.builds(_pb, st.integers(min_value=0, max_value=2**63 - 1),
                              st.text(max_size=8))
confluent = b"\x00\x00\x00\x00\x01"

VALUES = {
    "json": st.one_of(st.none(), garbage, json_values.map(lambda v: json.dumps(v).encode()),
                      json_records.map(lambda v: json.dumps(v).encode())),
    "string": st.one_of(st.none(), garbage, st.text(max_size=20).map(str.encode)),
    "int64": st.one_of(st.none(), garbage,
                       st.integers(min_value=-2**63, max_value=2**63 - 1)
                       .map(lambda n: struct.pack(">q", n))),
    "bytes": st.one_of(st.none(), garbage),
    "avro": st.one_of(st.none(), garbage, avro_required),
    "avro-confluent": st.one_of(st.none(), garbage, avro_required.map(lambda b: confluent + b),
                                avro_required),
    "avro-nullable": st.one_of(st.none(), garbage, avro_nullable),
    "protobuf": st.one_of(st.none(), garbage, protobuf_messages),
    "arrow_ipc": st.one_of(st.none(), garbage, ipc_streams, ipc_streams.map(lambda b: b[:-9])),
}


def _utf8(row: Any, value: bytes) -> bool:
    try:
        return row["data"] == value.decode("utf-8")
    except UnicodeDecodeError:
        return False


EXPECTED = {
    "string": _utf8,
    "int64": lambda row, value: len(value) == 8 and row["value"] == struct.unpack(">q", value)[0],
    "bytes": lambda row, value: (base64.b64decode(row["data"]), row["size"]) == (value, len(value)),
    # random bytes can be a valid message too (unknown fields are allowed by protobuf)
    "protobuf": lambda row, value: not _pb_shaped(value) or (
        row["id"], row["name"]) == _pb_fields(value),
}


def _ipc_rows(value: bytes) -> list[tuple[int, str]]:
    import pyarrow as pa

    table = pa.ipc.open_stream(pa.py_buffer(value)).read_all()
    return list(zip(table["id"].to_pylist(), table["name"].to_pylist(), strict=True))


def _pb_shaped(value: bytes) -> bool:
    try:
        return _pb(*_pb_fields(value)) == value
    except (IndexError, UnicodeDecodeError, ValueError):
        return False


def _pb_fields(value: bytes) -> tuple[int, str]:
    """(id, name) of a value :func:`_pb` wrote."""
    pos, n, shift = 1, 0, 0
    while True:
        b = value[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    size = value[pos + 1]
    return n, value[pos + 2:pos + 2 + size].decode()


def _decoder(spark, fmt: str, tmp_path_factory) -> tuple[Any, PartitionSpec]:  # noqa: ANN001
    from pyspark.sql import types as T

    from lakesink.decode import json_decoder
    from lakesink.decode.avro import AvroDecoder
    from lakesink.decode.raw import BytesDecoder, Int64Decoder, StringDecoder

    if fmt == "json":
        schema = T._parse_datatype_string(JSON_SCHEMA)
        spec = PartitionSpec.build(columns=["year"], schema=schema, timestamp_column="ts_ms")
        return json_decoder(schema, reject_unknown=False), spec
    decoder = {"string": StringDecoder, "int64": Int64Decoder, "bytes": BytesDecoder}.get(fmt)
    if decoder is not None:
        made = decoder()
    elif fmt == "arrow_ipc":
        from lakesink.decode.arrow_ipc import ArrowIpcDecoder

        made = ArrowIpcDecoder(T._parse_datatype_string("id bigint, name string"))
    elif fmt == "protobuf":
        from google.protobuf import descriptor_pb2

        from lakesink.decode.protobuf import ProtobufDecoder

        proto = descriptor_pb2.FileDescriptorProto(name="p.proto", package="t", syntax="proto3")
        msg = proto.message_type.add(name="P")
        msg.field.add(name="id", number=1, type=3, label=1)  # TYPE_INT64, LABEL_OPTIONAL
        msg.field.add(name="name", number=2, type=9, label=1)  # TYPE_STRING
        path = tmp_path_factory.mktemp("proto") / "p.desc"
        path.write_bytes(descriptor_pb2.FileDescriptorSet(file=[proto]).SerializeToString())
        made = ProtobufDecoder(str(path), "t.P")
    else:
        schema = AVRO_NULLABLE if fmt == "avro-nullable" else AVRO_REQUIRED
        made = AvroDecoder(spark, json.dumps(schema),
                           wire="confluent" if fmt == "avro-confluent" else "plain")
    return made, PartitionSpec.build(columns=[], schema=made.schema, timestamp_column=None)


def _records(spark, values: list[bytes | None]) -> Any:  # noqa: ANN001, ANN401
    """Raw records (the sources' shape) holding ``values``, offsets 0, 1, ..."""
    now = dt.datetime(2026, 1, 1)
    return spark.createDataFrame(
        [(b"k", v, "t", 0, i, now, 0) for i, v in enumerate(values)],
        "key binary, value binary, topic string, partition int, offset long, "
        "timestamp timestamp, timestampType int")


@pytest.mark.parametrize("fmt", sorted(VALUES))
def test_every_input_is_one_row_or_one_dead_letter(spark, fmt, tmp_path_factory) -> None:
    decoder, spec = _decoder(spark, fmt, tmp_path_factory)
    marker = Marker(  # the mark stage alone: no writer, no engine
        schema=decoder.schema,
        policy=EvolutionPolicy(mode="add_columns" if fmt == "json" else "strict",
                               unknown_fields="drop", type_widening=False),
        rebuild=lambda schema: (decoder, spec, schema))
    allowed = {*decoder.reasons, INVALID_TIMESTAMP}

    @settings(max_examples=6, deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(values=st.lists(VALUES[fmt], min_size=1, max_size=80))
    def check(values: list[bytes | None]) -> None:
        marked = marker.mark(_records(spark, values)).cache()
        try:
            good_rows = (marked.where("_fail IS NULL")
                         .select("offset", f"{marker.record}.*").collect())
            good = [r["offset"] for r in good_rows]
            rows = marker.good(marked).collect()  # the written columns evaluate
            bad = (marker.dead_letters(marked, 0, "prop")
                   .select("offset", "reason", "value").collect())
        finally:
            marked.unpersist()
        assert len(rows) == len(good)
        if decoder.explodes:  # a good record gives each of its rows once
            assert not set(good) & {r["offset"] for r in bad}
            good = sorted(set(good))
            for offset in good:
                want = _ipc_rows(values[offset])
                assert [(r["id"], r["name"]) for r in good_rows if r["offset"] == offset] == want
        offsets = sorted(good + [r["offset"] for r in bad])
        assert offsets == list(range(len(values))), "an input was lost or counted twice"
        for r in ([] if decoder.explodes else good_rows):  # a good row holds what an
            expected = EXPECTED.get(fmt)  # independent decoder reads
            if expected is not None:
                assert expected(r, values[r["offset"]]), (r, values[r["offset"]])
        for r in bad:
            assert r["reason"] in allowed, (r["reason"], values[r["offset"]])
            assert (None if r["value"] is None else bytes(r["value"])) == values[r["offset"]]

    check()


AVRO_WIDER = {**AVRO_REQUIRED, "fields": [*AVRO_REQUIRED["fields"],
                                          {"name": "extra", "type": "string"}]}
#: every kind of Avro type, to show the length check accepts what writers write
AVRO_SHAPES = {"type": "record", "name": "S", "fields": [
    {"name": "id", "type": "long"},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["A", "B"]}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10,
                                "scale": 2}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "either", "type": ["null", "long", "string"], "default": None},
    {"name": "maybe", "type": ["string", "null"]},
    {"name": "inner", "type": {"type": "record", "name": "I", "fields": [
        {"name": "x", "type": "double"}, {"name": "ok", "type": "boolean"},
        {"name": "raw", "type": "bytes"}, {"name": "f", "type": "float"}]}},
    {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 3}},
    {"name": "nested", "type": {"type": "array", "items": {
        "type": "map", "values": ["null", "int"]}}}]}


def _marked(spark, decoder: Any, values: list[bytes]) -> tuple[list[int], list[Any]]:  # noqa: ANN001
    """(offsets of good records, dead letters (offset, reason, detail)) of ``values``."""
    marker = Marker(schema=decoder.schema,
                    policy=EvolutionPolicy(mode="strict", unknown_fields="drop",
                                           type_widening=False),
                    rebuild=lambda schema: (decoder, PartitionSpec.build(
                        columns=[], schema=decoder.schema, timestamp_column=None), schema))
    marked = marker.mark(_records(spark, values)).cache()
    try:
        good = sorted(r["offset"] for r in marked.where("_fail IS NULL").select("offset")
                      .collect())
        assert len(marker.good(marked).collect()) == len(good)
        bad = sorted(marker.dead_letters(marked, 0, "t").select("offset", "reason", "detail")
                     .collect())
    finally:
        marked.unpersist()
    return good, bad


def test_an_avro_datum_with_bytes_after_it_is_a_dead_letter(spark) -> None:
    """known-open L15: ``from_avro`` reads one datum and ignores what follows, so a value
    written with a schema of more fields (its extra fields dropped silently), a datum
    with garbage after it, or two data in one value were rows. They are dead letters
    now, saying how many bytes follow; the data of every Avro type writers write (one
    block per array and map) still read as rows."""
    from decimal import Decimal

    from lakesink.decode.avro import AvroDecoder

    record = {"id": 7, "name": "seven", "ratio": 0.5}
    values = [_avro(AVRO_REQUIRED, record), _avro(AVRO_REQUIRED, record) + b"\x00",
              _avro(AVRO_WIDER, {**record, "extra": "dropped"}),
              _avro(AVRO_REQUIRED, record) + _avro(AVRO_REQUIRED, {**record, "id": 8}),
              _avro(AVRO_REQUIRED, {"id": -1, "name": "", "ratio": None})]
    good, bad = _marked(spark, AvroDecoder(spark, json.dumps(AVRO_REQUIRED)), values)
    assert good == [0, 4]
    assert [(r["offset"], r["reason"]) for r in bad] == [
        (1, "malformed_avro"), (2, "malformed_avro"), (3, "malformed_avro")]
    assert bad[0]["detail"].startswith(f"1 byte(s) follow the Avro datum ({len(values[1])} "
                                       "bytes)")
    unchecked = AvroDecoder(spark, json.dumps(AVRO_REQUIRED), check_length=False)
    assert _marked(spark, unchecked, values)[0] == [0, 1, 2, 3, 4]  # as before

    at = dt.datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=dt.UTC)
    shapes = [
        {"id": 0, "tags": [], "attrs": {}, "kind": "A", "amount": Decimal("0.00"), "at": at,
         "day": dt.date(1970, 1, 1), "either": None, "maybe": None,
         "inner": {"x": 0.0, "ok": False, "raw": b"", "f": 0.0}, "fx": b"\x00\x00\x00",
         "nested": []},
        {"id": -2**63, "tags": ["a", "ü" * 70], "attrs": {"k": 2**62, "l": -1}, "kind": "B",
         "amount": Decimal("-12345678.91"), "at": at, "day": dt.date(2999, 12, 31),
         "either": 2**40, "maybe": "x" * 200,
         "inner": {"x": -1e300, "ok": True, "raw": bytes(range(256)), "f": 3.5},
         "fx": b"abc", "nested": [{"a": None, "b": 1}, {}]},
        {"id": 2**63 - 1, "tags": ["t"] * 100, "attrs": {str(i): i for i in range(70)},
         "kind": "A", "amount": Decimal("99999999.99"), "at": at, "day": dt.date(1, 1, 1),
         "either": "text", "maybe": "", "inner": {"x": 1.5, "ok": True, "raw": b"\xff",
                                                  "f": -0.0},
         "fx": b"\xff\xfe\xfd", "nested": [{"k": -2**31}] * 3},
    ]
    decoder = AvroDecoder(spark, json.dumps(AVRO_SHAPES))
    good, bad = _marked(spark, decoder, [_avro(AVRO_SHAPES, r) for r in shapes])
    assert (good, bad) == ([0, 1, 2], [])
