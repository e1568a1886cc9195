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
import re
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.errors import one_line
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


#: the JVM exceptions that are the schema's verdict (Avro's parser, spark-avro's converter)
_SCHEMA_ERROR = re.compile(r"(?:org\.apache\.avro|org\.apache\.spark\.sql\.avro)\.[\w$.]+")


def _schema_answer(exc: Exception) -> str | None:
    """The probe's failure as an answer about the schema (None: it is not one): Spark's
    analysis, or a JVM exception thrown by Avro's parser or spark-avro's converter (by
    its class, not its text: py4j's message names spark-avro's function whatever
    failed), said as the JVM says it. An Error (memory, stack) or an unreachable JVM is
    not an answer."""
    from pyspark.errors import AnalysisException

    if isinstance(exc, AnalysisException):
        return one_line(exc, 200, name=False)
    java = getattr(exc, "java_exception", None)
    if java is None:
        return None
    try:
        name = str(java.getClass().getName())
        said = str(java.toString()) if hasattr(java, "toString") else str(exc)
    except Exception:  # noqa: BLE001 - the JVM cannot be asked: not a verdict
        return None
    if _SCHEMA_ERROR.fullmatch(name) is None:
        return None
    return one_line(said.removeprefix(f"{name}: "), 200, name=False)


def avro_struct(spark: SparkSession, text: str) -> T.StructType | str:
    """Spark's type of an Avro record schema (its text), or why it has none. Only an
    answer about the schema is a verdict (it is cached for the run: every record of that
    writer then takes it): Avro's or spark-avro's error, or Spark's analysis. Any other
    failure of the probe — the JVM unreachable, out of memory, the session stopping — is
    raised, and the batch is retried (known-open L14: it was cached as "Spark cannot
    read it", and that writer's good records went to the dead letters until a
    restart)."""
    from pyspark.sql.avro.functions import from_avro

    try:
        probe = spark.range(0).select(from_avro(F.lit(None).cast("binary"), text).alias("r"))
    except Exception as exc:
        answer = _schema_answer(exc)
        if answer is None:
            raise
        return f"Spark cannot read it: {answer}"
    struct = probe.schema["r"].dataType
    return struct if isinstance(struct, T.StructType) else "not a record"


_PRIMITIVE = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_NAMED = {"record", "error", "enum", "fixed"}


def _full(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _definitions(t: Any, ns: str, out: dict[str, tuple[Any, str]]) -> None:  # noqa: ANN401
    """Every named type defined in the Avro type ``t``: full name -> (definition, the
    namespace it was defined in)."""
    if isinstance(t, list):
        for x in t:
            _definitions(x, ns, out)
    elif isinstance(t, dict):
        kind = t.get("type")
        if kind in _NAMED and "name" in t:
            full = _full(t["name"], t.get("namespace", ns))
            out.setdefault(full, (t, ns))
            for f in t.get("fields", []):
                _definitions(f.get("type"), full.rpartition(".")[0], out)
        elif kind == "array":
            _definitions(t.get("items"), ns, out)
        elif kind == "map":
            _definitions(t.get("values"), ns, out)
        elif isinstance(kind, (dict, list)):
            _definitions(kind, ns, out)


def _inline(t: Any, ns: str, defs: dict[str, tuple[Any, str]], emitted: set[str]  # noqa: ANN401
            ) -> Any:  # noqa: ANN401
    """``t`` with every named type written out, fully named, at its first use in the
    reader and referenced by full name after (the reader's fields come in the table's
    order, and some writer fields are left out, so the writer's own order of
    definitions does not hold)."""
    if isinstance(t, list):
        return [_inline(x, ns, defs, emitted) for x in t]
    if isinstance(t, str):
        if t in _PRIMITIVE:
            return t
        full = _full(t, ns) if _full(t, ns) in defs else t
        if full in emitted or full not in defs:
            return full
        definition, def_ns = defs[full]
        return _inline(definition, def_ns, defs, emitted)
    if not isinstance(t, dict):
        return t
    kind = t.get("type")
    if kind in _NAMED and "name" in t:
        full = _full(t["name"], t.get("namespace", ns))
        if full in emitted:
            return full
        emitted.add(full)
        out = {k: v for k, v in t.items() if k != "aliases"}
        out["namespace"], _, out["name"] = full.rpartition(".")
        if "fields" in t:
            inner = full.rpartition(".")[0]
            out["fields"] = [{**f, "type": _inline(f.get("type"), inner, defs, emitted)}
                             for f in t["fields"]]
        return out
    if kind == "array":
        return {**t, "items": _inline(t.get("items"), ns, defs, emitted)}
    if kind == "map":
        return {**t, "values": _inline(t.get("values"), ns, defs, emitted)}
    if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind not in _PRIMITIVE):
        return {**t, "type": _inline(kind, ns, defs, emitted)}
    return t


def reader_schema(writer: WriterSchema, verdict: Verdict, table: T.StructType) -> str:
    """The Avro reader schema (JSON) that reads ``writer``'s records into the table."""
    doc = writer.parsed
    top = _full(str(doc.get("name", "")), str(doc.get("namespace", "")))
    ns = top.rpartition(".")[0]
    defs: dict[str, tuple[Any, str]] = {}
    _definitions(doc, ns, defs)
    emitted = {top}
    fields = {f["name"]: f for f in doc.get("fields", [])}
    reader_fields: list[dict[str, Any]] = []
    for i, column in enumerate(table.fields):
        if column.name not in fields:
            reader_fields.append({"name": column.name, "default": None, "type": [
                "null", avro_type(column.dataType, f"lakesink.missing.c{i}")]})
            continue
        wfield = {k: v for k, v in copy.deepcopy(fields[column.name]).items()
                  if k != "aliases"}
        wfield["type"] = _inline(wfield.get("type"), ns, defs, emitted)
        if column.name in verdict.promoted:
            wfield["type"] = _promote(wfield["type"],
                                      _AVRO_OF[type(verdict.promoted[column.name][1])])
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
        self._struct = T.StructType([*loose(schema).fields,  # type: ignore[attr-defined]
                                     T.StructField(OK_FIELD, T.BooleanType(), True)])
        super().__init__(schema, registry, policy)

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
            reader = reader_schema(writer, verdict, self.schema)
            # a reader Spark cannot parse, or that reads another struct than the table's,
            # would fail every batch: its writer's records are rejected instead
            struct = avro_struct(self.spark, reader)
            if isinstance(struct, str) or loose(struct) != loose(self._struct):
                return Verdict(reason=INCOMPATIBLE_SCHEMA, detail=(
                    f"schema id {writer.id}: no reader schema reads it into the table ("
                    f"{struct if isinstance(struct, str) else struct.simpleString()})"))
            verdict.reader = reader
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
