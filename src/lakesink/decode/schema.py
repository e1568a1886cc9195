"""Declared schemas: Arrow type names (as the Danube sink spells them) and Spark DDL.

Pure Python on top of ``pyspark.sql.types`` (no JVM), so ``lakesink validate`` and the
unit tests can check a schema without starting Spark.

Arrow names map to the closest Spark type; Spark has no unsigned integers, so each
``UInt<n>`` widens to the next signed type that holds every value.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pyspark.sql import types as T

from lakesink.errors import ConfigError

ARROW_TYPES: dict[str, T.DataType] = {
    "utf8": T.StringType(),
    "largeutf8": T.StringType(),
    "string": T.StringType(),
    "int8": T.ByteType(),
    "int16": T.ShortType(),
    "int32": T.IntegerType(),
    "int64": T.LongType(),
    "uint8": T.ShortType(),
    "uint16": T.IntegerType(),
    "uint32": T.LongType(),
    "uint64": T.DecimalType(20, 0),
    "float16": T.FloatType(),
    "float32": T.FloatType(),
    "float64": T.DoubleType(),
    "boolean": T.BooleanType(),
    "bool": T.BooleanType(),
    "timestamp": T.TimestampType(),
    "date32": T.DateType(),
    "date64": T.DateType(),
    "binary": T.BinaryType(),
    "largebinary": T.BinaryType(),
}

SPARK_SIMPLE: dict[str, T.DataType] = {
    "string": T.StringType(),
    "varchar": T.StringType(),
    "char": T.StringType(),
    "tinyint": T.ByteType(),
    "byte": T.ByteType(),
    "smallint": T.ShortType(),
    "short": T.ShortType(),
    "int": T.IntegerType(),
    "integer": T.IntegerType(),
    "bigint": T.LongType(),
    "long": T.LongType(),
    "float": T.FloatType(),
    "real": T.FloatType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
    "bool": T.BooleanType(),
    "timestamp": T.TimestampType(),
    "timestamp_ltz": T.TimestampType(),
    "timestamp_ntz": T.TimestampNTZType(),
    "date": T.DateType(),
    "binary": T.BinaryType(),
}

_TOKEN = re.compile(r"\s*(<|>|,|:|\(|\)|`[^`]+`|[A-Za-z_][A-Za-z0-9_]*|\d+)")


class _Parser:
    """A small recursive-descent parser for Spark DDL types (array, map, struct, decimal)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m:
                raise ValueError(f"unexpected {text[pos:pos + 10]!r}")
            self.tokens.append(m.group(1))
            pos = m.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok.lower() != expected):
            raise ValueError(f"expected {expected or 'a type'} in {self.text!r}")
        self.i += 1
        return tok

    def name(self) -> str:
        tok = self.take()
        return tok[1:-1] if tok.startswith("`") else tok

    def data_type(self) -> T.DataType:
        word = self.take().lower()
        if word == "array":
            self.take("<")
            element = self.data_type()
            self.take(">")
            return T.ArrayType(element, True)
        if word == "map":
            self.take("<")
            key = self.data_type()
            self.take(",")
            value = self.data_type()
            self.take(">")
            return T.MapType(key, value, True)
        if word == "struct":
            self.take("<")
            fields = []
            while self.peek() != ">":
                name = self.name()
                if self.peek() == ":":
                    self.take(":")
                fields.append(T.StructField(name, self.data_type(), self._nullable()))
                if self.peek() == ",":
                    self.take(",")
            self.take(">")
            return T.StructType(fields)
        if word in ("decimal", "dec", "numeric"):
            if self.peek() == "(":
                self.take("(")
                precision = int(self.take())
                scale = 0
                if self.peek() == ",":
                    self.take(",")
                    scale = int(self.take())
                self.take(")")
                return T.DecimalType(precision, scale)
            return T.DecimalType(10, 0)
        if word in ("varchar", "char") and self.peek() == "(":
            self.take("(")
            self.take()
            self.take(")")
            return T.StringType()
        if word in SPARK_SIMPLE:
            return SPARK_SIMPLE[word]
        raise ValueError(f"unknown type {word!r}")

    def _nullable(self) -> bool:
        if self.peek() and self.peek().lower() == "not":  # type: ignore[union-attr]
            self.take()
            self.take("null")
            return False
        return True

    def done(self) -> None:
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()!r} in {self.text!r}")


def parse_type(name: str) -> T.DataType:
    """``Int64`` / ``bigint`` / ``array<struct<a:int>>`` -> a Spark DataType."""
    key = name.strip().lower()
    if key in ARROW_TYPES:
        return ARROW_TYPES[key]
    parser = _Parser(name)
    dtype = parser.data_type()
    parser.done()
    return dtype


def parse_ddl(ddl: str) -> T.StructType:
    """``"a INT NOT NULL, b STRING"`` -> StructType."""
    parser = _Parser(f"struct<{ddl}>")
    dtype = parser.data_type()
    parser.done()
    assert isinstance(dtype, T.StructType)
    return dtype


def declared_schema(spec: Sequence[object] | str, *, key: str = "decode.schema") -> T.StructType:
    """Build the StructType of a declared schema; raise ConfigError naming the field."""
    if isinstance(spec, str):
        try:
            schema = parse_ddl(spec)
        except ValueError as exc:
            raise ConfigError(key, f"invalid DDL: {exc}") from None
    else:
        fields = []
        for i, f in enumerate(spec):
            name, type_name, nullable = f.name, f.type, f.nullable  # type: ignore[attr-defined]
            try:
                fields.append(T.StructField(name, parse_type(type_name), nullable))
            except ValueError as exc:
                raise ConfigError(
                    f"{key}[{i}].type", f"{exc} for field {name!r}",
                    fix="use an Arrow name (Utf8, Int64, Float64, Boolean, Timestamp, Date32, "
                    "Binary, …) or a Spark DDL type (string, bigint, array<int>, …)",
                ) from None
        schema = T.StructType(fields)
    names = [f.name for f in schema.fields]
    if not names:
        raise ConfigError(key, "declares no fields")
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ConfigError(key, f"field(s) declared twice: {sorted(dupes)}")
    return schema
