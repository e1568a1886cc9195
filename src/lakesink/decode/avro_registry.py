"""Avro records whose writer schema is named by id in a schema registry.

The rules every registry decoder follows are in :mod:`lakesink.decode.registered`.
Avro's part: a record is read with the writer schema of its id, resolved (Avro schema
resolution, inside ``from_avro``) to a *reader schema* made for the table: the table's
columns in the table's order (NULL defaults for the columns the writer lacks, ``int`` →
``long`` and ``float`` → ``double`` promotions where the column is wider), plus a
sentinel ``_lakesink_ok`` (default ``true``) that only a datum read to the end of its
record carries. One ``from_avro`` per record, whatever the number of writer schemas.
"""

from __future__ import annotations

import copy
import json
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.decode.base import CONFLUENT_HEADER, confluent_framed
from lakesink.decode.registered import (
    INCOMPATIBLE_SCHEMA,
    RegistryDecoder,
    Verdict,
    loose,
    schema_id,
)
from lakesink.decode.registry import SchemaRegistry, WriterSchema

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

    from lakesink.decode.evolution import EvolutionPolicy

MALFORMED_AVRO = "malformed_avro"
__all__ = ["MALFORMED_AVRO", "RegistryAvroDecoder", "avro_struct", "avro_type", "loose",
           "reader_schema", "spark_struct"]
OK_FIELD = "_lakesink_ok"

# Avro promotions that are also widenings of a Spark column (evolution.can_widen)
_PROMOTED = {("int", "long"), ("float", "double")}
_AVRO_OF = {T.IntegerType: "int", T.LongType: "long", T.FloatType: "float",
            T.DoubleType: "double"}


def avro_type(dtype: T.DataType, name: str) -> Any:  # noqa: ANN401 - Avro's JSON
    """An Avro type (JSON) that Spark reads back as ``dtype``; records are named under
    ``name`` so they never clash with a writer's named types."""
    simple = {T.StringType: "string", T.LongType: "long", T.IntegerType: "int",
              T.ShortType: "int", T.ByteType: "int", T.DoubleType: "double",
              T.FloatType: "float", T.BooleanType: "boolean", T.BinaryType: "bytes"}
    if type(dtype) in simple:
        return simple[type(dtype)]
    if isinstance(dtype, T.DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(dtype, T.TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(dtype, T.TimestampType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(dtype, T.DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": dtype.precision,
                "scale": dtype.scale}
    if isinstance(dtype, T.ArrayType):
        return {"type": "array", "items": ["null", avro_type(dtype.elementType, name + "_e")]}
    if isinstance(dtype, T.MapType):
        return {"type": "map", "values": ["null", avro_type(dtype.valueType, name + "_v")]}
    if isinstance(dtype, T.StructType):
        return {"type": "record", "name": name.rpartition(".")[2],
                "namespace": name.rpartition(".")[0] or "lakesink.missing",
                "fields": [{"name": f.name, "type": ["null", avro_type(f.dataType,
                                                                     f"{name}_{i}")],
                            "default": None} for i, f in enumerate(dtype.fields)]}
    raise ValueError(f"no Avro type for {dtype.simpleString()}")


def _promote(avro: Any, to: str) -> Any:  # noqa: ANN401 - Avro's JSON
    """The writer field type ``avro`` (int/float, maybe in a union) promoted to ``to``."""
    if isinstance(avro, list):
        return [_promote(t, to) for t in avro]
    if isinstance(avro, dict) and "logicalType" not in avro and avro.get("type") in ("int",
                                                                                   "float"):
        return {**avro, "type": to}
    if avro in ("int", "float"):
        return to
    return avro


def spark_struct(spark: SparkSession, registry: SchemaRegistry, writer: WriterSchema
                 ) -> T.StructType | str:
    """Spark's type of an Avro record schema (cached per id), or why it has none."""
    cache = registry.spark_types
    if writer.id not in cache:
        cache[writer.id] = (avro_struct(spark, writer.text) if writer.record_name
                            else f"a {writer.schema_type} schema, not an Avro record (its "
                            "fields would be the columns)")
    return cache[writer.id]


def avro_struct(spark: SparkSession, text: str) -> T.StructType | str:
    """Spark's type of an Avro record schema (its text), or why it has none."""
    from pyspark.sql.avro.functions import from_avro

    try:
        probe = spark.range(0).select(from_avro(F.lit(None).cast("binary"), text).alias("r"))
    except Exception as exc:  # noqa: BLE001 - Spark's analysis error, as text
        return f"Spark cannot read it: {str(exc).splitlines()[0][:200]}"
    struct = probe.schema["r"].dataType
    return struct if isinstance(struct, T.StructType) else "not a record"


def reader_schema(writer: WriterSchema, verdict: Verdict, table: T.StructType) -> str:
    """The Avro reader schema (JSON) that reads ``writer``'s records into the table."""
    doc = writer.parsed
    fields = {f["name"]: f for f in doc.get("fields", [])}
    reader_fields: list[dict[str, Any]] = []
    for column in table.fields:
        if column.name not in fields:
            reader_fields.append({"name": column.name, "default": None, "type": [
                "null", avro_type(column.dataType, f"lakesink.missing.{column.name}")]})
            continue
        wfield = copy.deepcopy(fields[column.name])
        if column.name in verdict.promoted:
            wfield["type"] = _promote(wfield["type"],
                                      _AVRO_OF[type(verdict.promoted[column.name][1])])
        wfield.pop("aliases", None)
        reader_fields.append(wfield)
    reader_fields.append({"name": OK_FIELD, "type": "boolean", "default": True})
    reader = {k: v for k, v in doc.items() if k not in ("fields", "aliases")}
    reader["fields"] = reader_fields
    return json.dumps(reader)


class RegistryAvroDecoder(RegistryDecoder):
    malformed = MALFORMED_AVRO

    def __init__(self, spark: SparkSession, schema: T.StructType, registry: SchemaRegistry,
                 policy: EvolutionPolicy) -> None:
        self.spark = spark
        super().__init__(schema, registry, policy)
        self._struct = T.StructType([*self.schema.fields,
                                     T.StructField(OK_FIELD, T.BooleanType(), True)])

    def struct_of(self, writer: WriterSchema) -> T.StructType | str:
        return spark_struct(self.spark, self.registry, writer)

    def judge(self, writer: WriterSchema) -> Verdict:
        verdict = super().judge(writer)
        if verdict.reason is None:
            pairs = {(_AVRO_OF.get(type(w)), _AVRO_OF.get(type(c)))
                     for w, c in verdict.promoted.values()}
            if pairs - _PROMOTED:  # a widening Avro's resolution cannot do
                return Verdict(reason=INCOMPATIBLE_SCHEMA, detail=(
                    f"schema id {writer.id}: a field needs a promotion Avro cannot read "
                    f"({sorted(verdict.promoted)})"))
            verdict.reader = reader_schema(writer, verdict, self.schema)
        return verdict

    def unreadable(self, parsed: Column) -> Column:
        return parsed[OK_FIELD].isNull()

    def parse(self, value: Column) -> Column:
        from pyspark.sql.avro.functions import from_avro

        sid = schema_id(value)
        payload = F.substring(value, CONFLUENT_HEADER + 1, 2**31 - 1)
        expr = None
        for i, verdict in self.readable.items():
            writer = self.registry.known[i]
            assert isinstance(writer, WriterSchema)
            read = from_avro(payload, writer.text,
                             {"mode": "PERMISSIVE", "avroSchema": verdict.reader}
                             ).cast(self._struct)
            expr = (F.when(sid == F.lit(i), read) if expr is None
                    else expr.when(sid == F.lit(i), read))
        if expr is None:
            return F.lit(None).cast(self._struct)
        return F.when(confluent_framed(value), expr)
