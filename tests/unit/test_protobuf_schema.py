"""Protobuf descriptor -> Spark schema, Confluent framing, config errors: no Spark."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from pyspark.sql import types as T

from lakesink.decode.protobuf import (
    _strip_confluent,
    load_descriptor,
    message_index_path,
    spark_schema,
)
from lakesink.errors import ConfigError

F = descriptor_pb2.FieldDescriptorProto


def _write(tmp_path: Path, proto: descriptor_pb2.FileDescriptorProto) -> str:
    path = tmp_path / "x.desc"
    path.write_bytes(descriptor_pb2.FileDescriptorSet(file=[proto]).SerializeToString())
    return str(path)


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="x.proto", package="p", syntax="proto3")
    first = proto.message_type.add(name="First")
    first.field.add(name="a", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    first.field.add(name="b", number=2, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    first.field.add(name="c", number=3, type=F.TYPE_FIXED32, label=F.LABEL_OPTIONAL)
    first.field.add(name="d", number=4, type=F.TYPE_BYTES, label=F.LABEL_REPEATED)
    nested = first.nested_type.add(name="Nested")
    nested.field.add(name="s", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    first.field.add(name="n", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".p.First.Nested")
    loop = proto.message_type.add(name="Loop")
    loop.field.add(name="next", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                   type_name=".p.Loop")
    return proto


def test_types_map_to_spark(tmp_path: Path) -> None:
    _, desc = load_descriptor(_write(tmp_path, _file()), "p.First")
    assert spark_schema(desc) == T.StructType([
        T.StructField("a", T.IntegerType()), T.StructField("b", T.DecimalType(20, 0)),
        T.StructField("c", T.LongType()), T.StructField("d", T.ArrayType(T.BinaryType())),
        T.StructField("n", T.StructType([T.StructField("s", T.StringType())]))])


def test_message_index_paths(tmp_path: Path) -> None:
    path = _write(tmp_path, _file())
    assert message_index_path(load_descriptor(path, "p.First")[1]) == [0]
    assert message_index_path(load_descriptor(path, "p.Loop")[1]) == [1]
    assert message_index_path(load_descriptor(path, "p.First.Nested")[1]) == [0, 0]


def test_confluent_framing_checks_the_index_path() -> None:
    header = b"\x00\x00\x00\x00\x07"
    assert _strip_confluent(header + b"\x00" + b"MSG", [0]) == b"MSG"
    assert _strip_confluent(header + b"\x04\x00\x00" + b"MSG", [0, 0]) == b"MSG"
    with pytest.raises(ValueError, match=r"\[1\] is not"):
        _strip_confluent(header + b"\x02\x02" + b"MSG", [0])


@pytest.mark.parametrize("message, key, text", [
    ("p.Loop", "decode.protobuf.message", "recursive"),
    ("p.Nope", "decode.protobuf.message", "no message 'p.Nope'"),
])
def test_message_errors(tmp_path: Path, message: str, key: str, text: str) -> None:
    path = _write(tmp_path, _file())
    with pytest.raises(ConfigError) as err:
        spark_schema(load_descriptor(path, message)[1])
    assert err.value.key == key and text in err.value.message


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_descriptor(str(tmp_path / "missing.desc"), "p.First")
    assert err.value.key == "decode.protobuf.descriptor_file"
    junk = tmp_path / "junk.desc"
    junk.write_bytes(b"\xff\xff not a descriptor")
    with pytest.raises(ConfigError) as err:
        load_descriptor(str(junk), "p.First")
    assert err.value.key == "decode.protobuf.descriptor_file"


def test_config_requires_descriptor_and_message() -> None:
    from lakesink.config.loader import load_config

    with pytest.raises(ConfigError) as err:
        load_config(overrides=["source.kafka.bootstrap_servers=a:1", "source.kafka.topics=t",
                               "decode.format=protobuf", "decode.protobuf.message=p.X"], env={})
    assert err.value.key == "decode.protobuf.descriptor_file"
