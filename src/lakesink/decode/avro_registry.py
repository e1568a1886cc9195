"""Avro records whose writer schema is named by id in a schema registry.

Each value carries the Confluent framing (magic byte ``0``, a 4-byte big-endian schema
id, then the datum). The id is looked up in the registry
(:class:`~lakesink.decode.registry.SchemaRegistry`) and the datum is read with that
writer schema, resolved (Avro schema resolution, inside ``from_avro``) to a *reader
schema* made for the table: the table's columns in the table's order, plus a sentinel
``_lakesink_ok`` (default ``true``) that only a datum read to the end of its record
carries. One ``from_avro`` per record, whatever the number of writer schemas.

Per writer schema (decided on the driver, when its id is first seen, against the
table's current schema):

* a table column the writer lacks reads as NULL (the reader field's default);
* a writer field whose type is narrower of the same family (int in a bigint column,
  float in a double one) is promoted by Avro's resolution;
* a writer field the table lacks, or one wider than its column (a bigint in an int
  column), evolves the table like a new JSON field (``table.schema_evolution:
  add_columns``; ``table.type_widening``) — decided before the batch is written; under
  ``strict`` the field is dropped (``unknown_fields: drop``, counted) or the record is
  rejected (``reject``: ``unknown_field``);
* any other difference (a string in a bigint column, a nested record whose fields
  changed, a non-Avro or non-record schema): the schema is *incompatible* and its
  records are rejected as ``incompatible_schema``, the id and the field in the detail.

Records whose id is new to the run are marked :data:`UNRESOLVED`; the batch processor
then looks the batch's new ids up, evolves the table if a writer asks for it, and
decodes the batch again (:meth:`lakesink.pipeline.batch.BatchProcessor._evolve`). That
marker never reaches the rejected area. An id the registry does not have:
``unknown_schema_id``. Columns, array elements and map values are always nullable:
a record of an older schema has no value for a newer column, and writers differ in
what they let be null.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.decode.base import (
    BAD_MAGIC_BYTE,
    CONFLUENT_HEADER,
    NULL_VALUE,
    Decoder,
    confluent_framed,
    framing_detail,
)
from lakesink.decode.evolution import EvolutionPolicy, can_widen
from lakesink.decode.registry import MISSING, SchemaRegistry, WriterSchema

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

MALFORMED_AVRO = "malformed_avro"
UNKNOWN_SCHEMA_ID = "unknown_schema_id"
INCOMPATIBLE_SCHEMA = "incompatible_schema"
UNKNOWN_FIELD = "unknown_field"
#: an id not yet looked up: the batch resolves it and decodes again (never written)
UNRESOLVED = "_unresolved_schema_id"
OK_FIELD = "_lakesink_ok"

# Avro promotions that are also widenings of a Spark column (evolution.can_widen)
_PROMOTED = {("int", "long"), ("float", "double")}
_AVRO_OF = {T.IntegerType: "int", T.LongType: "long", T.FloatType: "float",
            T.DoubleType: "double"}


def schema_id(value: Column) -> Column:
    """The 4-byte big-endian schema id after the magic byte, as a bigint."""
    return F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("long")


def loose(dtype: T.DataType) -> T.DataType:
    """``dtype`` with every nullability flag set (types compared for compatibility)."""
    if isinstance(dtype, T.StructType):
        return T.StructType([T.StructField(f.name, loose(f.dataType), True)
                             for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(loose(dtype.elementType), True)
    if isinstance(dtype, T.MapType):
        return T.MapType(loose(dtype.keyType), loose(dtype.valueType), True)
    return dtype


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


@dataclass
class Verdict:
    """How the records of one writer schema are read into the table."""

    reader: str | None = None  # the reader schema (JSON), when they can be read
    reason: str | None = None  # else why they are rejected
    detail: str = ""
    extra: list[str] = field(default_factory=list)  # writer fields the table lacks


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


def judge(writer: WriterSchema, struct: T.StructType | str, table: T.StructType) -> Verdict:
    """The :class:`Verdict` of one writer schema against the table's schema."""
    where = f"schema id {writer.id}"
    if isinstance(struct, str):
        return Verdict(reason=INCOMPATIBLE_SCHEMA, detail=f"{where}: {struct}")
    doc = writer.parsed
    fields = {f["name"]: f for f in doc.get("fields", [])}
    wtypes = {f.name: f.dataType for f in struct.fields}
    reader_fields: list[dict[str, Any]] = []
    for column in table.fields:
        wt = wtypes.get(column.name)
        if wt is None:
            reader_fields.append({"name": column.name, "default": None, "type": [
                "null", avro_type(column.dataType, f"lakesink.missing.{column.name}")]})
            continue
        wfield = copy.deepcopy(fields[column.name])
        if loose(wt) != loose(column.dataType):
            pair = (_AVRO_OF.get(type(wt)), _AVRO_OF.get(type(column.dataType)))
            if pair not in _PROMOTED:
                return Verdict(reason=INCOMPATIBLE_SCHEMA, detail=(
                    f"{where}: field {column.name!r} is {wt.simpleString()}, the table's "
                    f"column is {column.dataType.simpleString()}"))
            wfield["type"] = _promote(wfield["type"], pair[1])
        wfield.pop("aliases", None)
        reader_fields.append(wfield)
    extra = [n for n in wtypes if n not in table.fieldNames()]
    reader_fields.append({"name": OK_FIELD, "type": "boolean", "default": True})
    reader = {k: v for k, v in doc.items() if k not in ("fields", "aliases")}
    reader["fields"] = reader_fields
    return Verdict(reader=json.dumps(reader), extra=extra)


def proposals(spark: SparkSession, registry: SchemaRegistry, writers: list[WriterSchema],
              table: T.StructType, policy: EvolutionPolicy
              ) -> tuple[T.StructType, dict[str, T.DataType]]:
    """The new columns and widenings that ``writers`` ask of the table (what a JSON
    batch's inference would find)."""
    have = {f.name: f.dataType for f in table.fields}
    new: list[T.StructField] = []
    widen: dict[str, T.DataType] = {}
    for writer in writers:
        struct = spark_struct(spark, registry, writer)
        if isinstance(struct, str):
            continue
        for f in struct.fields:
            current = have.get(f.name)
            if current is None:
                if policy.adds_columns and f.name not in {n.name for n in new}:
                    new.append(T.StructField(f.name, loose(f.dataType), True))
            elif policy.type_widening and can_widen(current, f.dataType):
                if f.name not in widen or can_widen(widen[f.name], f.dataType):
                    widen[f.name] = f.dataType
    return T.StructType(new), widen


class RegistryAvroDecoder(Decoder):
    """The decoder of one table schema and the ids resolved so far (rebuilt by the
    batch processor when either changes)."""

    reasons = (NULL_VALUE, BAD_MAGIC_BYTE, UNKNOWN_SCHEMA_ID, INCOMPATIBLE_SCHEMA,
               UNKNOWN_FIELD, MALFORMED_AVRO)
    resolves_ids = True

    def __init__(self, spark: SparkSession, schema: T.StructType, registry: SchemaRegistry,
                 policy: EvolutionPolicy) -> None:
        super().__init__(loose(schema))  # type: ignore[arg-type]
        self.spark = spark
        self.registry = registry
        self.policy = policy
        self.verdicts: dict[int, Verdict] = {}
        for schema_id_, writer in sorted(registry.known.items()):
            if writer == MISSING:
                self.verdicts[schema_id_] = Verdict(
                    reason=UNKNOWN_SCHEMA_ID,
                    detail=f"schema id {schema_id_} is not in the registry {registry.url}")
            else:
                assert isinstance(writer, WriterSchema)
                self.verdicts[schema_id_] = judge(
                    writer, spark_struct(spark, registry, writer), self.schema)
        self._struct = T.StructType([*self.schema.fields,
                                     T.StructField(OK_FIELD, T.BooleanType(), True)])

    def new_ids(self, ids: list[int]) -> tuple[T.StructType, dict[str, T.DataType]]:
        """Look ``ids`` up; what their writers ask of the table (see :func:`proposals`)."""
        found = self.registry.lookup(ids)
        writers = [w for w in found.values() if isinstance(w, WriterSchema)]
        return proposals(self.spark, self.registry, writers, self.schema, self.policy)

    def parse(self, value: Column) -> Column:
        from pyspark.sql.avro.functions import from_avro

        sid = schema_id(value)
        payload = F.substring(value, CONFLUENT_HEADER + 1, 2**31 - 1)
        readable = [(i, v) for i, v in self.verdicts.items() if v.reader is not None]
        if not readable:
            return F.lit(None).cast(self._struct)
        expr = None
        for i, verdict in readable:
            writer = self.registry.known[i]
            assert isinstance(writer, WriterSchema)
            read = from_avro(payload, writer.text,
                             {"mode": "PERMISSIVE", "avroSchema": verdict.reader}
                             ).cast(self._struct)
            expr = (F.when(sid == F.lit(i), read) if expr is None
                    else expr.when(sid == F.lit(i), read))
        assert expr is not None
        return F.when(confluent_framed(value), expr)

    def _ids_with(self, predicate: Any) -> list[int]:  # noqa: ANN401
        return [i for i, v in self.verdicts.items() if predicate(v)]

    def failure(self, value: Column, parsed: Column, unknown: Column | None = None) -> Column:
        sid = schema_id(value)
        out = (F.when(value.isNull(), F.lit(NULL_VALUE))
               .when(~confluent_framed(value), F.lit(BAD_MAGIC_BYTE)))
        known = list(self.verdicts)
        out = out.when(~sid.isin(*known) if known else F.lit(True), F.lit(UNRESOLVED))
        for reason in (UNKNOWN_SCHEMA_ID, INCOMPATIBLE_SCHEMA):
            ids = self._ids_with(lambda v, r=reason: v.reason == r)
            if ids:
                out = out.when(sid.isin(*ids), F.lit(reason))
        if self.policy.rejects_unknown:
            ids = self._ids_with(lambda v: v.reader is not None and v.extra)
            if ids:
                out = out.when(sid.isin(*ids), F.lit(UNKNOWN_FIELD))
        return out.when(parsed[OK_FIELD].isNull(), F.lit(MALFORMED_AVRO))

    def unknown_keys(self, value: Column, parsed: Column | None = None) -> Column:
        """The writer fields the table lacks (under ``strict``: dropped or rejected)."""
        sid = schema_id(value)
        expr = None
        for i, v in self.verdicts.items():
            if v.reader is not None and v.extra:
                names = F.array(*[F.lit(n) for n in v.extra])
                expr = F.when(sid == F.lit(i), names) if expr is None else expr.when(
                    sid == F.lit(i), names)
        empty = F.array().cast("array<string>")
        return empty if expr is None else expr.otherwise(empty)

    def explain(self, value: Column, parsed: Column) -> tuple[Column, Column]:
        sid = schema_id(value)
        reason = self.failure(value, parsed)
        detail = (F.when(value.isNull(), F.lit("the record has no value (tombstone)"))
                  .when(~confluent_framed(value), framing_detail(value)))
        for i, v in self.verdicts.items():
            if v.reason is not None:
                detail = detail.when(sid == F.lit(i), F.lit(v.detail))
            elif v.extra and self.policy.rejects_unknown:
                detail = detail.when(
                    (sid == F.lit(i)) & (reason == F.lit(UNKNOWN_FIELD)),
                    F.lit(f"schema id {i}: fields outside the table: {', '.join(v.extra)} "
                          "(table.schema_evolution: strict, unknown_fields: reject)"))
        detail = detail.otherwise(F.concat(
            F.lit("the value cannot be read with writer schema id "), sid.cast("string"),
            F.lit(" ("), F.length(value).cast("string"), F.lit(" bytes)")))
        return reason, detail
