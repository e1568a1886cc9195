"""Schema evolution: how a table's schema may change when records stop fitting it.

``table.schema_evolution``:

* ``add_columns`` (default): a top-level field that is not in the schema becomes a new
  nullable column, typed the way Spark's JSON inference types it (bigint, double,
  string, boolean, struct, array). Existing columns never change type except by
  widening (below). Delta appends with ``mergeSchema``; Parquet tables record every
  version of the schema in ``.lakesink/<table>/schema.json`` and every file is written
  with the full current schema, so all files read together (readers fill new columns
  with NULL in older files).
* ``strict``: the schema never changes. A record with fields outside the schema either
  loses them (``unknown_fields: drop``, counted and logged per batch, recorded in the
  batch's commit info) or is rejected with the reason ``unknown_field``
  (``unknown_fields: reject``).

Type widening (``table.type_widening``): a value that does not fit its column but fits
a wider type of the same family (tinyint → smallint → int → bigint, float → double)
widens the column for every later file. Any other change (a string in a number column,
a fraction in an integer column) is rejected per record as ``schema_mismatch``, so two
files of one table never disagree on a column's type (the Quix sink's int/float drift).

This module is pure Python on ``pyspark.sql.types`` (no JVM): the rules and the record
stored in ``schema.json``. The Spark side (finding candidates in a batch) lives in
:mod:`lakesink.pipeline.evolver`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pyspark.sql import types as T

from lakesink.errors import ConfigError

Policy = Literal["add_columns", "strict"]
UnknownFields = Literal["drop", "reject"]

# Each type may widen to the types after it in its family.
_FAMILIES: tuple[tuple[type[T.DataType], ...], ...] = (
    (T.ByteType, T.ShortType, T.IntegerType, T.LongType),
    (T.FloatType, T.DoubleType),
)
# What a value that overflowed a narrow type is tried as (the widest of its family).
WIDEST: dict[type[T.DataType], T.DataType] = {
    T.ByteType: T.LongType(), T.ShortType: T.LongType(), T.IntegerType: T.LongType(),
    T.FloatType: T.DoubleType(),
}


def can_widen(current: T.DataType, wider: T.DataType) -> bool:
    """True when ``current`` may become ``wider`` (a strictly wider type of its family)."""
    a, b = type(current), type(wider)
    for family in _FAMILIES:
        if a in family and b in family:
            return family.index(b) > family.index(a)
    return False


def widenable(field: T.StructField) -> bool:
    return type(field.dataType) in WIDEST


@dataclass(frozen=True)
class EvolutionPolicy:
    mode: Policy = "add_columns"
    unknown_fields: UnknownFields = "drop"
    type_widening: bool = True
    #: add_columns: the most fields the schema may grow to; a record whose new fields
    #: would pass it is a dead letter (``too_many_fields``)
    max_columns: int = 1000

    @property
    def adds_columns(self) -> bool:
        return self.mode == "add_columns"

    @property
    def rejects_unknown(self) -> bool:
        return self.mode == "strict" and self.unknown_fields == "reject"

    @property
    def watches_unknown(self) -> bool:
        """Whether records that keep unknown fields are counted (and the schema may
        grow from them); under ``reject`` such records never pass."""
        return self.mode == "add_columns" or self.unknown_fields == "drop"


def evolve(
    schema: T.StructType,
    *,
    new_fields: T.StructType | None = None,
    widen: Mapping[str, T.DataType] | None = None,
) -> tuple[T.StructType, list[str]]:
    """``schema`` with ``new_fields`` appended (nullable) and columns widened.

    Returns the new schema and a readable list of the changes (empty: unchanged).
    Widenings that are not allowed by :func:`can_widen` are ignored.
    """
    changes: list[str] = []
    fields = []
    for f in schema.fields:
        target = (widen or {}).get(f.name)
        if target is not None and can_widen(f.dataType, target):
            changes.append(f"{f.name}: {f.dataType.simpleString()} -> {target.simpleString()}")
            f = T.StructField(f.name, target, f.nullable, f.metadata)
        fields.append(f)
    known = set(schema.fieldNames())
    for f in (new_fields.fields if new_fields else []):
        if f.name in known:
            continue
        known.add(f.name)
        fields.append(T.StructField(f.name, f.dataType, True))
        changes.append(f"+ {f.name} {f.dataType.simpleString()}")
    return T.StructType(fields), changes


def reconcile_declared(
    declared: T.StructType, stored: T.StructType | None, policy: EvolutionPolicy
) -> tuple[T.StructType, list[str]]:
    """The schema to run with when a schema is declared and the table has one stored.

    Declared fields come first with their declared nullability; a column the table
    already widened keeps its wider type; a declared type wider than the stored one
    widens it. Columns the table gained by ``add_columns`` are kept under that policy.
    Any other type difference would make files of one table disagree and is refused.
    """
    if stored is None:
        return declared, []
    have = {f.name: f for f in stored.fields}
    fields: list[T.StructField] = []
    changes: list[str] = []
    for f in declared.fields:
        old = have.get(f.name)
        if old is None or old.dataType == f.dataType or can_widen(old.dataType, f.dataType):
            fields.append(f)
            if old is not None and old.dataType != f.dataType:
                changes.append(f"{f.name}: {old.dataType.simpleString()} -> "
                               f"{f.dataType.simpleString()} (declared)")
        elif can_widen(f.dataType, old.dataType):
            fields.append(T.StructField(f.name, old.dataType, f.nullable, f.metadata))
        else:
            raise ConfigError(
                "decode.schema",
                f"field {f.name!r} is declared {f.dataType.simpleString()} but the table "
                f"already stores it as {old.dataType.simpleString()}",
                fix="declare the table's type (or a wider one of the same family), "
                "or write to a new table",
            )
    if policy.adds_columns:
        declared_names = set(declared.fieldNames())
        fields.extend(f for f in stored.fields if f.name not in declared_names)
    return T.StructType(fields), changes


def schema_record(
    schema: T.StructType,
    *,
    source: str,
    declared: Mapping[str, Any] | None,
    previous: Mapping[str, Any] | None = None,
    changes: list[str] | None = None,
    batch_id: int | None = None,
) -> dict[str, Any]:
    """The JSON stored in ``schema.json``: the current schema plus its history.

    ``declared`` is the declared schema's JSON form (None: inferred). A new version is
    recorded only when the schema differs from ``previous``'s.
    """
    import json

    history = list((previous or {}).get("history", []))
    version = int((previous or {}).get("version", 0))
    current = json.loads(schema.json())
    if previous is None or previous.get("schema") != current:
        version += 1
        history.append({
            "version": version,
            "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "batch_id": batch_id,
            "changes": changes or [],
            "schema": schema.simpleString(),
        })
    return {
        "source": source,
        "declared": declared,
        "version": version,
        "schema": current,
        "history": history,
    }
