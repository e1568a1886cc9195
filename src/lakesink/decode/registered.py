"""Decoders whose writer schema is named by id in a schema registry (Avro, Protobuf).

Each value carries the Confluent framing (magic byte ``0``, a 4-byte big-endian schema
id, then the payload). The id is looked up in the registry
(:class:`~lakesink.decode.registry.SchemaRegistry`); per writer schema — decided on the
driver when its id is first seen, against the table's current schema — a
:class:`Verdict`:

* a table column the writer lacks reads as NULL;
* a writer field whose type is narrower of the same family (int in a bigint column,
  float in a double one) is read into the wider column;
* a writer field the table lacks, or one wider than its column (a bigint in an int
  column), evolves the table like a new JSON field (``table.schema_evolution:
  add_columns``; ``table.type_widening``) — decided before the batch is written; under
  ``strict`` the field is dropped (``unknown_fields: drop``, counted) or the record is
  rejected (``reject``: ``unknown_field``);
* any other difference (a string in a bigint column, a nested record whose fields
  changed, a schema of another kind): the schema is *incompatible* and its records are
  rejected as ``incompatible_schema``, the id and the field in the detail.

Records whose id is new to the run are marked :data:`UNRESOLVED`; the batch processor
then looks the batch's new ids up, evolves the table if a writer asks for it, and
decodes the batch again (:meth:`lakesink.pipeline.evolver.SchemaEvolver.evolve`). That
marker never reaches the rejected area. An id the registry does not have:
``unknown_schema_id``. Columns, array elements and map values are always nullable:
a record of an older schema has no value for a newer column, and writers differ in
what they let be null.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.decode.base import (
    BAD_MAGIC_BYTE,
    NULL_VALUE,
    Decoder,
    confluent_framed,
    framing_detail,
)
from lakesink.decode.evolution import EvolutionPolicy, can_widen
from lakesink.decode.registry import MISSING, SchemaRegistry, WriterSchema

if TYPE_CHECKING:
    from pyspark.sql import Column

UNKNOWN_SCHEMA_ID = "unknown_schema_id"
INCOMPATIBLE_SCHEMA = "incompatible_schema"
UNKNOWN_FIELD = "unknown_field"
#: an id not yet looked up: the batch resolves it and decodes again (never written)
UNRESOLVED = "_unresolved_schema_id"


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


@dataclass
class Verdict:
    """How the records of one writer schema are read into the table."""

    reason: str | None = None  # why they are rejected (None: they are read)
    detail: str = ""
    extra: list[str] = field(default_factory=list)  # writer fields the table lacks
    #: writer fields read into a wider column: name -> (writer type, column type)
    promoted: dict[str, tuple[T.DataType, T.DataType]] = field(default_factory=dict)
    reader: Any = None  # what the format reads them with (Avro: a reader schema)


def compare(writer_id: int, struct: T.StructType | str, table: T.StructType) -> Verdict:
    """The verdict of a writer schema's Spark struct (or why it has none) against the
    table's schema."""
    where = f"schema id {writer_id}"
    if isinstance(struct, str):
        return Verdict(reason=INCOMPATIBLE_SCHEMA, detail=f"{where}: {struct}")
    wtypes = {f.name: f.dataType for f in struct.fields}
    promoted = {}
    for column in table.fields:
        wt = wtypes.get(column.name)
        if wt is None or loose(wt) == loose(column.dataType):
            continue
        if not can_widen(wt, column.dataType):
            return Verdict(reason=INCOMPATIBLE_SCHEMA, detail=(
                f"{where}: field {column.name!r} is {wt.simpleString()}, the table's "
                f"column is {column.dataType.simpleString()}"))
        promoted[column.name] = (wt, column.dataType)
    return Verdict(extra=[n for n in wtypes if n not in table.fieldNames()],
                   promoted=promoted)


def proposals(structs: list[T.StructType | str], table: T.StructType,
              policy: EvolutionPolicy) -> tuple[T.StructType, dict[str, T.DataType]]:
    """The new columns and widenings that writer structs ask of the table (what a JSON
    batch's inference would find)."""
    have = {f.name: f.dataType for f in table.fields}
    new: list[T.StructField] = []
    widen: dict[str, T.DataType] = {}
    for struct in structs:
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


class RegistryDecoder(Decoder):
    """The decoder of one table schema and the ids resolved so far (rebuilt by the
    batch processor when either changes). A format gives a writer schema's Spark struct
    (:meth:`struct_of`), how its records are read (:meth:`judge`, :meth:`parse`) and how
    an unreadable payload shows in the parsed struct (:meth:`unreadable`)."""

    #: the reason of a payload its writer schema cannot read
    malformed: str = "malformed"

    def __init__(self, schema: T.StructType, registry: SchemaRegistry,
                 policy: EvolutionPolicy) -> None:
        super().__init__(loose(schema))  # type: ignore[arg-type]
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
                self.verdicts[schema_id_] = self.judge(writer)

    @property
    def reasons(self) -> tuple[str, ...]:  # type: ignore[override]
        return (NULL_VALUE, BAD_MAGIC_BYTE, UNKNOWN_SCHEMA_ID, INCOMPATIBLE_SCHEMA,
                UNKNOWN_FIELD, self.malformed)

    @abstractmethod
    def struct_of(self, writer: WriterSchema) -> T.StructType | str:
        """The Spark struct of a writer schema, or why it has none (cached per id)."""

    def judge(self, writer: WriterSchema) -> Verdict:
        return compare(writer.id, self.struct_of(writer), self.schema)

    @abstractmethod
    def unreadable(self, parsed: Column) -> Column:
        """True when a record of a readable writer schema could not be read."""

    def unreadable_detail(self, value: Column, parsed: Column, sid: Column) -> Column:
        return F.concat(F.lit("the value cannot be read with writer schema id "),
                        sid.cast("string"), F.lit(" ("), F.length(value).cast("string"),
                        F.lit(" bytes)"))

    @property
    def readable(self) -> dict[int, Verdict]:
        return {i: v for i, v in self.verdicts.items() if v.reason is None}

    def new_ids(self, ids: list[int]) -> tuple[T.StructType, dict[str, T.DataType]]:
        """Look ``ids`` up; what their writers ask of the table (see :func:`proposals`).
        Every id given counts, also one an earlier attempt of the batch looked up: a
        retried batch must ask for the same change again."""
        self.registry.lookup(ids)
        writers = [self.registry.known.get(int(i)) for i in ids]
        structs = [self.struct_of(w) for w in writers if isinstance(w, WriterSchema)]
        return proposals(structs, self.schema, self.policy)

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
            ids = self._ids_with(lambda v: v.reason is None and v.extra)
            if ids:
                out = out.when(sid.isin(*ids), F.lit(UNKNOWN_FIELD))
        return out.when(self.unreadable(parsed), F.lit(self.malformed))

    def unknown_keys(self, value: Column, parsed: Column | None = None) -> Column:
        """The writer fields the table lacks (under ``strict``: dropped or rejected)."""
        sid = schema_id(value)
        expr = None
        for i, v in self.readable.items():
            if v.extra:
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
        return reason, detail.otherwise(self.unreadable_detail(value, parsed, sid))
