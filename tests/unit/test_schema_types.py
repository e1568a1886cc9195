"""Declared schema types: Arrow names of the Danube sink and Spark DDL (no JVM)."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from lakesink.config.decode import FieldSpec
from lakesink.decode.schema import declared_schema, parse_ddl, parse_type
from lakesink.errors import ConfigError


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Utf8", T.StringType()), ("Int8", T.ByteType()), ("Int16", T.ShortType()),
        ("Int32", T.IntegerType()), ("Int64", T.LongType()),
        ("UInt8", T.ShortType()), ("UInt16", T.IntegerType()), ("UInt32", T.LongType()),
        ("UInt64", T.DecimalType(20, 0)), ("Float32", T.FloatType()), ("Float64", T.DoubleType()),
        ("Boolean", T.BooleanType()), ("Timestamp", T.TimestampType()), ("Date32", T.DateType()),
        ("Date64", T.DateType()), ("Binary", T.BinaryType()),
        ("string", T.StringType()), ("BIGINT", T.LongType()), ("int", T.IntegerType()),
        ("decimal(12, 3)", T.DecimalType(12, 3)), ("timestamp_ntz", T.TimestampNTZType()),
        ("array<int>", T.ArrayType(T.IntegerType())),
        ("map<string,double>", T.MapType(T.StringType(), T.DoubleType())),
        ("struct<a:int, b:array<string>>", T.StructType([
            T.StructField("a", T.IntegerType()),
            T.StructField("b", T.ArrayType(T.StringType()))])),
    ],
)
def test_type_names(name: str, expected: T.DataType) -> None:
    assert parse_type(name) == expected


def test_unsigned_types_hold_every_value() -> None:
    # the widest unsigned values must fit the chosen signed type
    assert T.LongType().simpleString() == parse_type("UInt32").simpleString()
    assert parse_type("UInt64").precision >= len(str(2**64 - 1))  # type: ignore[attr-defined]


def test_ddl_with_nullability_and_quoting() -> None:
    schema = parse_ddl("id BIGINT NOT NULL, `odd name` STRING, tags ARRAY<STRING>")
    assert schema.fieldNames() == ["id", "odd name", "tags"]
    assert schema["id"].nullable is False
    assert schema["odd name"].nullable is True


def test_declared_list_keeps_nullability() -> None:
    schema = declared_schema([FieldSpec(name="id", type="Int64", nullable=False),
                              FieldSpec(name="v", type="Float64")])
    assert schema == T.StructType([T.StructField("id", T.LongType(), False),
                                   T.StructField("v", T.DoubleType(), True)])


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ([FieldSpec(name="a", type="Int64"), FieldSpec(name="b", type="Int128")],
         "decode.schema[1].type"),
        ([FieldSpec(name="a", type="array<int")], "decode.schema[0].type"),
        ([FieldSpec(name="a", type="Int64"), FieldSpec(name="a", type="Utf8")], "decode.schema"),
        ("a int, b nonsense", "decode.schema"),
        ([], "decode.schema"),
    ],
)
def test_bad_schema_names_the_key(spec: object, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        declared_schema(spec)  # type: ignore[arg-type]
    assert info.value.key == key
