"""JSON payloads -> typed columns with Spark's ``from_json`` (no per-row Python).

A record is rejected, never dropped, when its value is null or empty, is not JSON,
is not a JSON object, has a field whose value does not fit the declared type, or lacks
a value for a field declared ``nullable: false``.
The cheap test (``failure``) runs on every row; the precise reason (``explain``)
only on the rejected ones.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql import types as T

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

logger = logging.getLogger(__name__)

CORRUPT = "_lakesink_corrupt"

# Reason codes written to the rejected area.
NULL_VALUE = "null_value"
MALFORMED_JSON = "malformed_json"
NOT_AN_OBJECT = "not_an_object"
SCHEMA_MISMATCH = "schema_mismatch"
MISSING_REQUIRED = "missing_required"


class JsonDecoder:
    """Decode a binary/string ``value`` column against ``schema``."""

    def __init__(self, schema: T.StructType) -> None:
        if CORRUPT in schema.fieldNames():
            raise ValueError(f"{CORRUPT} is reserved")
        self.schema = schema
        self.required = [f.name for f in schema.fields if not f.nullable]
        self._parse_schema = T.StructType(
            [T.StructField(f.name, f.dataType, True) for f in schema.fields]
            + [T.StructField(CORRUPT, T.StringType(), True)]
        )

    @property
    def fields(self) -> list[str]:
        return self.schema.fieldNames()

    def parse(self, value: Column) -> Column:
        """A struct of the declared fields (plus the corrupt-record marker)."""
        return F.from_json(
            value.cast("string"), self._parse_schema,
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
        )

    def _missing_required(self, parsed: Column) -> Column | None:
        """True when a ``nullable: false`` field is null or absent (None: none declared)."""
        checks = [parsed[name].isNull() for name in self.required]
        return functools.reduce(operator.or_, checks) if checks else None

    def failure(self, value: Column, parsed: Column) -> Column:
        """NULL for a good record; a non-null marker for a record to reject."""
        marker = (
            F.when(value.isNull(), F.lit(NULL_VALUE))
            .when(parsed.isNull(), F.lit(MALFORMED_JSON))
            .when(parsed[CORRUPT].isNotNull(), F.lit(SCHEMA_MISMATCH))
        )
        missing = self._missing_required(parsed)
        return marker if missing is None else marker.when(missing, F.lit(MISSING_REQUIRED))

    def explain(self, value: Column, parsed: Column) -> tuple[Column, Column]:
        """(reason code, human detail) for a rejected record. Costly; rejected rows only."""
        text = value.cast("string")
        variant = F.try_parse_json(text)
        kind = F.schema_of_variant(variant)
        corrupt = parsed[CORRUPT].isNotNull()
        reason = (
            F.when(value.isNull(), F.lit(NULL_VALUE))
            .when(variant.isNull(), F.lit(MALFORMED_JSON))
            .when(~kind.startswith("OBJECT"), F.lit(NOT_AN_OBJECT))
            .when(corrupt | F.lit(not self.required), F.lit(SCHEMA_MISMATCH))
            .otherwise(F.lit(MISSING_REQUIRED))
        )
        missing = [F.when(parsed[name].isNull(), F.lit(name)) for name in self.required]
        mismatches = []
        for f in self.schema.fields:
            got = F.try_variant_get(variant, _path(f.name), "variant")
            mismatches.append(F.when(
                parsed[f.name].isNull() & got.isNotNull() & ~F.is_variant_null(got),
                F.concat(F.lit(f"{f.name}: expected {f.dataType.simpleString()}, got "),
                         F.lower(F.schema_of_variant(got))),
            ))
        detail = (
            F.when(value.isNull(), F.lit("the record has no value (tombstone)"))
            .when(F.length(text) == 0, F.lit("the value is empty"))
            .when(variant.isNull(), F.lit("the value is not valid JSON"))
            .when(~kind.startswith("OBJECT"),
                  F.concat(F.lit("expected a JSON object, got "), F.lower(kind)))
            .when(corrupt, F.concat_ws("; ", *mismatches) if mismatches else F.lit(""))
            .otherwise(F.concat(F.lit("required field(s) without a value: "),
                                F.concat_ws(", ", *missing) if missing else F.lit("")))
        )
        return reason, detail


def _path(name: str) -> str:
    return "$['" + name.replace("'", "\\'") + "']"


def infer_schema(spark: SparkSession, samples: Sequence[str]) -> T.StructType:
    """Infer a schema from sample JSON texts the way Spark's JSON reader does.

    Malformed samples are ignored; integers become ``bigint``, decimals ``double``,
    strings stay strings (timestamps included).
    """
    rdd = spark.sparkContext.parallelize(list(samples), 1)
    df = spark.read.options(mode="DROPMALFORMED").json(rdd)
    schema = df.schema
    fields = [f for f in schema.fields if f.name != "_corrupt_record"]
    return T.StructType([T.StructField(f.name, f.dataType, True) for f in fields])
