"""Protobuf payloads, against a descriptor set file and a message name.

Spark's own ``from_protobuf`` (spark-protobuf) is not served on Maven Central for Spark
4.2, so records are decoded in Python by the ``protobuf`` runtime (upb, C) inside one
Arrow UDF per batch — the slow path the design allows where Spark has no function.

The descriptor set is what ``protoc --descriptor_set_out=x.desc --include_imports``
writes (the same file ``from_protobuf`` takes). Columns are the message's fields:

=================================  ==========================================
protobuf                           Spark
=================================  ==========================================
int32, sint32, sfixed32            int
uint32, fixed32, int64, sint64,    bigint
sfixed64
uint64, fixed64                    decimal(20,0) (every value fits)
float / double / bool / string     float / double / boolean / string
bytes                              binary
enum                               string (the value's name; the number if unknown)
message                            struct (NULL when not set)
google.protobuf.Timestamp          timestamp
repeated T / map<K, V>             array<T> / map<K, V>
=================================  ==========================================

A proto3 scalar without ``optional`` has no presence: an unset one reads as its
default (0, "", false), as every protobuf reader sees it. Fields with presence
(``optional``, proto2, messages) are NULL when unset. Recursive messages are refused at
start. With ``wire: confluent`` the value starts with magic byte ``0``, a 4-byte schema
id and the message-index path, which must point at the configured message.

Rejections: ``null_value``; ``bad_magic_byte`` (Confluent framing missing);
``malformed_protobuf`` (the bytes do not parse as the message, or the Confluent index
path names another message).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
import decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.decode.base import (
    BAD_MAGIC_BYTE,
    NULL_VALUE,
    Decoder,
    confluent_framed,
    framing_detail,
)
from lakesink.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column

MALFORMED_PROTOBUF = "malformed_protobuf"
ERROR_FIELD = "_lakesink_error"
_KEY = "decode.protobuf"
_TIMESTAMP = "google.protobuf.Timestamp"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _message_descriptor(descriptor_set: bytes, message: str) -> Any:  # noqa: ANN401
    from google.protobuf import descriptor_pb2, descriptor_pool

    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return pool.FindMessageTypeByName(message)


def load_descriptor(path: str, message: str) -> tuple[bytes, Any]:
    """(the descriptor set's bytes, the message's descriptor); ConfigErrors name the key."""
    from google.protobuf.message import DecodeError

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{_KEY}.descriptor_file", f"cannot read {path}: {exc}") from None
    try:
        desc = _message_descriptor(data, message)
    except (DecodeError, TypeError) as exc:
        raise ConfigError(f"{_KEY}.descriptor_file",
                          f"{path} is not a descriptor set (protoc --descriptor_set_out "
                          f"--include_imports): {exc}") from None
    except KeyError:
        raise ConfigError(f"{_KEY}.message", f"no message {message!r} in {path} (use the "
                          "full name, package included)") from None
    return data, desc


def _repeated(field: Any) -> bool:  # noqa: ANN401
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return field.label == field.LABEL_REPEATED


def _is_map(field: Any) -> bool:  # noqa: ANN401
    return bool(field.message_type is not None and field.message_type.GetOptions().map_entry)


def spark_schema(desc: Any, seen: tuple[str, ...] = ()) -> T.StructType:  # noqa: ANN401
    """The Spark struct of a message descriptor (see the module table)."""
    if desc.full_name in seen:
        raise ConfigError(f"{_KEY}.message", f"{desc.full_name} is recursive "
                          f"({' -> '.join((*seen, desc.full_name))}); not supported")
    fields = []
    for f in desc.fields:
        if _is_map(f):
            key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name[
                "value"]
            dtype: T.DataType = T.MapType(_scalar_type(key, seen + (desc.full_name,)),
                                          _scalar_type(value, seen + (desc.full_name,)))
        elif _repeated(f):
            dtype = T.ArrayType(_scalar_type(f, seen + (desc.full_name,)))
        else:
            dtype = _scalar_type(f, seen + (desc.full_name,))
        fields.append(T.StructField(f.name, dtype, True))
    return T.StructType(fields)


def _scalar_type(f: Any, seen: tuple[str, ...]) -> T.DataType:  # noqa: ANN401
    t = f.type
    if t == f.TYPE_MESSAGE:
        if f.message_type.full_name == _TIMESTAMP:
            return T.TimestampType()
        return spark_schema(f.message_type, seen)
    if t == f.TYPE_ENUM or t == f.TYPE_STRING:
        return T.StringType()
    if t in (f.TYPE_INT32, f.TYPE_SINT32, f.TYPE_SFIXED32):
        return T.IntegerType()
    if t in (f.TYPE_UINT32, f.TYPE_FIXED32, f.TYPE_INT64, f.TYPE_SINT64, f.TYPE_SFIXED64):
        return T.LongType()
    if t in (f.TYPE_UINT64, f.TYPE_FIXED64):
        return T.DecimalType(20, 0)
    return {f.TYPE_FLOAT: T.FloatType(), f.TYPE_DOUBLE: T.DoubleType(),
            f.TYPE_BOOL: T.BooleanType(), f.TYPE_BYTES: T.BinaryType()}[t]


def message_index_path(desc: Any) -> list[int]:  # noqa: ANN401
    """The Confluent message-index path of a message within its .proto file."""
    path = []
    while desc is not None:
        parent = desc.containing_type
        siblings = parent.nested_types if parent is not None else list(
            desc.file.message_types_by_name.values())
        path.append([s.full_name for s in siblings].index(desc.full_name))
        desc = parent
    return list(reversed(path))


# -- the per-record conversion (runs in the Python workers) ---------------------------

def _value(f: Any, v: Any) -> Any:  # noqa: ANN401
    t = f.type
    if t == f.TYPE_MESSAGE:
        if f.message_type.full_name == _TIMESTAMP:
            return _EPOCH + dt.timedelta(seconds=v.seconds, microseconds=v.nanos // 1000)
        return to_python(v)
    if t == f.TYPE_ENUM:
        named = f.enum_type.values_by_number.get(v)
        return named.name if named is not None else str(v)
    if t in (f.TYPE_UINT64, f.TYPE_FIXED64):
        return decimal.Decimal(v)
    return v


def to_python(msg: Any) -> dict[str, Any]:  # noqa: ANN401
    """A parsed message as the row :func:`spark_schema` describes."""
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        v = getattr(msg, f.name)
        if _is_map(f):
            vf = f.message_type.fields_by_name["value"]
            out[f.name] = [(k, _value(vf, v[k])) for k in v]
        elif _repeated(f):
            out[f.name] = [_value(f, x) for x in v]
        elif f.has_presence and not msg.HasField(f.name):
            out[f.name] = None
        else:
            out[f.name] = _value(f, v)
    return out


def _zigzag_varints(data: bytes, pos: int, count: int | None) -> tuple[list[int], int]:
    out = []
    while count is None or len(out) < count:
        shift = result = 0
        while True:
            if pos >= len(data):
                raise ValueError("the message-index path is cut off")
            b = data[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        out.append((result >> 1) ^ -(result & 1))
        if count is None:
            return out, pos
    return out, pos


def _strip_confluent(data: bytes, expected: list[int]) -> bytes:
    (count,), pos = _zigzag_varints(data, 5, None)
    indexes, pos = _zigzag_varints(data, pos, count) if count else ([0], pos)
    if indexes != expected:
        raise ValueError(f"the Confluent message-index path {indexes} is not the configured "
                         f"message's {expected}")
    return data[pos:]


class _Converter:
    """The UDF body; built once per worker from the descriptor set's bytes."""

    def __init__(self, descriptor_set: bytes, message: str, confluent: bool,
                 schema: T.StructType) -> None:
        self.descriptor_set = descriptor_set
        self.message = message
        self.confluent = confluent
        self.schema = schema
        self._cls: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cls": None}

    def __call__(self, values: pa.Array) -> pa.Array:
        from google.protobuf import message_factory
        from pyspark.sql.pandas.types import to_arrow_type

        if self._cls is None:
            desc = _message_descriptor(self.descriptor_set, self.message)
            self._cls = message_factory.GetMessageClass(desc)
            self._expected = message_index_path(desc)
            self._arrow = to_arrow_type(T.StructType(
                [*self.schema.fields, T.StructField(ERROR_FIELD, T.StringType())]),
                timezone="UTC")
        rows = []
        for data in values.to_pylist():
            if data is None:
                rows.append(None)
                continue
            try:
                if self.confluent:
                    if len(data) < 5 or data[0] != 0:
                        rows.append(None)  # failure() reports bad_magic_byte
                        continue
                    data = _strip_confluent(data, self._expected)
                row = to_python(self._cls.FromString(data))
                row[ERROR_FIELD] = None
            except Exception as exc:  # noqa: BLE001 - any parse error is the record's
                row = {ERROR_FIELD: f"{type(exc).__name__}: {exc}"[:500]}
            rows.append(row)
        return pa.array(rows, type=self._arrow)


def converted(converter: Callable[[pa.Array], pa.Array], schema: T.StructType,
              value: Column) -> Column:
    """``value`` through ``converter`` in one Arrow UDF per batch: the struct of
    ``schema``'s fields plus :data:`ERROR_FIELD` (a shared converter, with a registry or
    a descriptor file)."""
    from pyspark.sql.functions import arrow_udf

    returns = T.StructType([*schema.fields, T.StructField(ERROR_FIELD, T.StringType())])

    def decode(values: pa.Array) -> pa.Array:
        return converter(values)

    return arrow_udf(decode, returns)(value)


class ProtobufDecoder(Decoder):
    reasons = (NULL_VALUE, BAD_MAGIC_BYTE, MALFORMED_PROTOBUF)

    def __init__(self, descriptor_file: str, message: str, *, wire: str = "plain") -> None:
        data, desc = load_descriptor(descriptor_file, message)
        super().__init__(spark_schema(desc))
        self.confluent = wire == "confluent"
        self.converter = _Converter(data, message, self.confluent, self.schema)

    def parse(self, value: Column) -> Column:
        return converted(self.converter, self.schema, value)

    def _framed(self, value: Column) -> Column:
        return confluent_framed(value) if self.confluent else F.lit(True)

    def failure(self, value: Column, parsed: Column, unknown: Column | None = None) -> Column:
        return (F.when(value.isNull(), F.lit(NULL_VALUE))
                .when(~self._framed(value), F.lit(BAD_MAGIC_BYTE))
                .when(parsed.isNull() | parsed[ERROR_FIELD].isNotNull(),
                      F.lit(MALFORMED_PROTOBUF)))

    def explain(self, value: Column, parsed: Column) -> tuple[Column, Column]:
        size = F.length(value).cast("string")
        detail = (
            F.when(value.isNull(), F.lit("the record has no value (tombstone)"))
            .when(~self._framed(value), framing_detail(value))
            .otherwise(F.concat(
                F.lit(f"cannot read the value as {self.converter.message} ("), size,
                F.lit(" bytes): "), F.coalesce(parsed[ERROR_FIELD], F.lit("?")))))
        return self.failure(value, parsed), detail
