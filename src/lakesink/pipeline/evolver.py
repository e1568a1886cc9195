"""The evolve stage: when a batch's counts say the schema must change (new fields under
``add_columns``, values a wider type would take, schema ids new to a registry decoder),
work out the new schema from the batch, store it, and mark with it from then on.

A schema is stored (:data:`SchemaStore`, ``schema.json``) *before* the batch that evolved
it is written, so a replay after a crash decodes the batch with the schema its files were
(or will be) written with. The rules of what may change are
:mod:`lakesink.decode.evolution`'s; this stage only applies them to a batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.decode.evolution import WIDEST, evolve
from lakesink.decode.json import SCHEMA_MISMATCH, _path, infer_schema
from lakesink.decode.registered import UNRESOLVED, RegistryDecoder, schema_id
from lakesink.faults import fault_point
from lakesink.pipeline.marks import MARK, BatchCounts

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakesink.pipeline.marker import Marker

logger = logging.getLogger(__name__)

#: rows of new fields sampled to type them (the rest are decoded with those types)
EVOLUTION_SAMPLE = 10_000
#: how often one batch may evolve the schema before leftovers count as unknown
MAX_EVOLUTIONS_PER_BATCH = 3
UNKNOWN_NAMES_REPORTED = 20

# (schema, changes, batch id) -> None: store an evolved schema durably
SchemaStore = Callable[[T.StructType, list[str], int], None]


class SchemaEvolver:
    """Evolves ``marker``'s schema; ``on_change(schema, changes)`` is told each schema to
    mark with from then on (after it is stored) and how many changes made it."""

    def __init__(self, marker: Marker, spark: SparkSession, store: SchemaStore,
                 on_change: Callable[[T.StructType, int], None]) -> None:
        self.marker = marker
        self.spark = spark
        self.store = store
        self.on_change = on_change

    def needed(self, counts: BatchCounts) -> bool:
        """Whether the schema (or, for new schema ids, the decoder) must change first;
        a registry decoder's unknown fields are ones its writers' resolution already
        left out (case-variants of columns, reserved names)."""
        m = self.marker
        return bool((counts.unknown and m.policy.adds_columns and not m.resolves_ids)
                    or counts.mismatch or counts.unresolved)

    def evolve(self, marked: DataFrame, counts: BatchCounts, batch_id: int) -> bool:
        """Evolve and store the schema if this batch needs it; True when it changed."""
        m = self.marker
        resolved = bool(counts.unresolved)
        if resolved:  # the decoder is rebuilt below even if the schema stays
            new_fields, widen = self._resolve_ids(marked)
        else:
            new_fields = (self._new_fields(marked)
                          if m.policy.adds_columns and counts.unknown else None)
            if new_fields is not None and len(new_fields.fields) > m.room():
                # records that each fit may together pass the cap: the first fields
                # (by name) become columns; a record with any of the rest is a dead
                # letter (too_many_fields) when the batch is marked again
                kept = sorted(new_fields.fields, key=lambda f: f.name)[: m.room()]
                logger.warning("batch %d: %d new field(s), room for %d under "
                               "table.max_columns=%d", batch_id, len(new_fields.fields),
                               len(kept), m.policy.max_columns)
                new_fields = T.StructType(kept)
            widen = self._widenings(marked) if counts.mismatch else {}
        schema, changes = evolve(m.schema, new_fields=new_fields, widen=widen)
        if not changes:
            if resolved:
                self.on_change(m.schema, 0)
            return resolved
        self.store(schema, changes, batch_id)
        fault_point("after_schema_evolved", batch_id)
        logger.warning("batch %d: table schema evolved: %s", batch_id, "; ".join(changes))
        self.on_change(schema, len(changes))
        return True

    def unknown_names(self, marked: DataFrame) -> list[str]:
        """Up to :data:`UNKNOWN_NAMES_REPORTED` names of fields outside the schema."""
        rows = (marked.where(F.col(MARK.fail).isNull())
                .select(F.explode(MARK.extra).alias("k")).distinct()
                .limit(UNKNOWN_NAMES_REPORTED).collect())
        return sorted(r["k"] for r in rows)

    def _new_fields(self, marked: DataFrame) -> T.StructType:
        """Types of the unknown fields, inferred from (a sample of) the records with them."""
        rows = (marked.where((F.size(MARK.extra) > 0) & F.col(MARK.fail).isNull())
                .select(F.col("value").cast("string")).limit(EVOLUTION_SAMPLE).collect())
        return self._addable(infer_schema(self.spark, [r[0] for r in rows]))

    def _resolve_ids(self, marked: DataFrame) -> tuple[T.StructType, dict[str, T.DataType]]:
        """Look the batch's new schema ids up (a registry decoder); the columns and
        widenings their writer schemas ask of the table."""
        decoder = self.marker.decoder
        assert isinstance(decoder, RegistryDecoder)
        rows = (marked.where(F.col(MARK.fail) == F.lit(UNRESOLVED))
                .select(schema_id(F.col("value")).alias("id")).distinct().collect())
        new_fields, widen = decoder.new_ids([r["id"] for r in rows])
        return self._addable(new_fields), widen

    def _addable(self, inferred: T.StructType) -> T.StructType:
        """The fields of ``inferred`` that may become columns (not a case-variant of a
        column, nor a reserved name)."""
        m = self.marker
        taken = {n.lower() for n in m.columns.fieldNames()}
        fields = []
        for f in inferred.fields:
            if (f.name.lower() in taken or f.name.startswith("_lakesink")
                    or f.name in m.source_columns.names
                    or (m.transforms and f.name.lower() == "kafka")):
                continue  # a case-variant of a column (or a reserved name) stays unknown
            taken.add(f.name.lower())
            fields.append(f)
        return T.StructType(fields)

    def _widenings(self, marked: DataFrame) -> dict[str, T.DataType]:
        """Columns whose rejected values only need a wider type of the column's family
        (JSON values: read again as a variant, to see the number that did not fit)."""
        candidates = self.marker.widenable()
        bad = marked.where(F.col(MARK.fail) == F.lit(SCHEMA_MISMATCH))
        variant = F.try_parse_json(F.col("value").cast("string"))
        aggs = []
        for f in candidates:
            parsed = F.col(MARK.record)[f.name]
            got = F.try_variant_get(variant, _path(f.name), "variant")
            if isinstance(f.dataType, T.FloatType):
                aggs.append(F.count_if(F.abs(parsed) == F.lit(float("inf"))).alias(f.name))
            else:  # integral: a whole number that overflowed the column's type
                whole = parsed.isNull() & (F.schema_of_variant(got) == F.lit("BIGINT"))
                aggs.append(F.max(F.when(whole, F.abs(
                    F.try_variant_get(variant, _path(f.name), "bigint")))).alias(f.name))
        row = bad.agg(*aggs).first() if aggs else None
        widen: dict[str, T.DataType] = {}
        for f in candidates:
            value = row[f.name] if row is not None else None
            if not value:
                continue
            if isinstance(f.dataType, T.FloatType):
                widen[f.name] = WIDEST[T.FloatType]
            else:
                widen[f.name] = _narrowest_integral(int(value))
        return widen


def _narrowest_integral(magnitude: int) -> T.DataType:
    if magnitude <= 2**15 - 1:
        return T.ShortType()
    if magnitude <= 2**31 - 1:
        return T.IntegerType()
    return T.LongType()
