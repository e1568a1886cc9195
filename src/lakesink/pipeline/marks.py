"""The marked frame's shape, spelled once: the columns the mark stage adds to a batch's
raw records, the reasons it marks a record with, and the counts taken over it.

A marked frame holds the raw columns (``key``, ``value``, ``topic``, ``partition``,
``offset``, ``kafka_timestamp``, ``timestampType``, maybe ``headers``) and the columns of
:data:`MARK`. A row whose :attr:`MarkedColumns.fail` is null is a good row; any other
value is the reason it is a dead letter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from lakesink.decode.json import SCHEMA_MISMATCH
from lakesink.decode.registered import INCOMPATIBLE_SCHEMA


@dataclass(frozen=True)
class MarkedColumns:
    """The names of the columns the mark stage adds."""

    record: str = "_r"  #: the parsed record
    exploded: str = "_x"  #: one of an exploding decoder's rows
    transformed: str = "_t"  #: the record (or row) after the transforms
    ts: str = "_ts"  #: its UTC timestamp (with a timestamp column)
    extra: str = "_extra"  #: the top-level keys the schema lacks
    fail: str = "_fail"  #: the rejection reason; null for a good row


MARK = MarkedColumns()

INVALID_TIMESTAMP = "invalid_timestamp"
INVALID_PARTITION_VALUE = "invalid_partition_value"
TOO_MANY_FIELDS = "too_many_fields"
#: reasons of the "schema" stage (the value decoded but does not fit the table); the
#: rest are "decode" (the value could not be read at all)
SCHEMA_REASONS = ("schema_mismatch", "missing_required", "unknown_field", INVALID_TIMESTAMP,
                  INVALID_PARTITION_VALUE, INCOMPATIBLE_SCHEMA, TOO_MANY_FIELDS)
assert SCHEMA_MISMATCH in SCHEMA_REASONS


@dataclass(frozen=True)
class BatchCounts:
    """What the count over a marked frame found (the aggregates' aliases)."""

    records: int = 0
    rejected: int = 0
    #: good records with fields outside the schema (when the policy watches them)
    unknown: int = 0
    #: records rejected for a value too wide for its column (when widening is on)
    mismatch: int = 0
    #: records whose schema id the registry decoder has not resolved yet
    unresolved: int = 0

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> BatchCounts:
        names = {f.name for f in fields(cls)}
        return cls(**{k: int(v or 0) for k, v in values.items() if k in names})

    @property
    def written(self) -> int:
        return self.records - self.rejected
