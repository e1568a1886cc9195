"""JSON payloads -> typed columns with Spark's ``from_json`` (no per-row Python).

A record is rejected, never dropped, when its value is null or empty, is not JSON (not
UTF-8, or a string with a ``\\uXXXX`` escape of half a UTF-16 surrogate pair: no
Unicode character, which Spark's reader would write as ``?``),
is not a JSON object, has a field whose value does not fit the declared type (a
``float`` that overflows to infinity included), lacks a value for a field declared
``nullable: false``, or — with ``reject_unknown`` — has a top-level field the schema
does not know.
The cheap test (``failure``) runs on every row; the precise reason (``explain``)
only on the rejected ones.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.decode.base import NULL_VALUE, Decoder, combine

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

logger = logging.getLogger(__name__)

CORRUPT = "_lakesink_corrupt"
#: lakesink's Java colon counter (``jvm/udf``), when the session registered it
COUNT_COLONS = "lakesink_count_colons"

# Reason codes written to the rejected area (and NULL_VALUE, common to every format).
MALFORMED_JSON = "malformed_json"
NOT_AN_OBJECT = "not_an_object"
SCHEMA_MISMATCH = "schema_mismatch"
MISSING_REQUIRED = "missing_required"
UNKNOWN_FIELD = "unknown_field"

# a JSON string's \uXXXX escape of a high (D800-DBFF) or low (DC00-DFFF) surrogate
_HIGH = r"\\u[dD][89abAB][0-9a-fA-F]{2}"
_LOW = r"\\u[dD][c-fC-F][0-9a-fA-F]{2}"
#: half a pair: a high one not followed by a low one, a low one not after a high one
_LONE_SURROGATE = f"{_HIGH}(?!{_LOW})|(?<!{_HIGH}){_LOW}"


def lone_surrogate(text: Column) -> Column:
    """True when the JSON text escapes half a UTF-16 surrogate pair (``"\\udc80"``):
    valid JSON grammar with no Unicode character behind it, which Spark's JSON reader
    turns into ``?`` (a silent change of the value; pyarrow's refuses it). Escaped
    backslashes (``\\\\``) are replaced first, so ``"\\\\udc80"`` (a backslash and the
    letters) is no escape, and by a letter, so the halves around one are not joined.
    Only texts holding ``\\u`` pay for the regex."""
    unescaped = F.regexp_replace(text, r"\\\\", "_")  # not "": it would join two halves
    return text.contains("\\u") & unescaped.rlike(_LONE_SURROGATE)


class JsonDecoder(Decoder):
    """Decode a binary/string ``value`` column against ``schema``."""

    reasons = (NULL_VALUE, "malformed_json", "not_an_object", "schema_mismatch",
               "missing_required", "unknown_field")

    def __init__(self, schema: T.StructType, *, reject_unknown: bool = False,
                 count_colons: bool = False) -> None:
        """``count_colons``: the session has :data:`COUNT_COLONS` (see
        :meth:`unknown_keys`)."""
        if CORRUPT in schema.fieldNames():
            raise ValueError(f"{CORRUPT} is reserved")
        super().__init__(schema)
        self.reject_unknown = reject_unknown
        self.count_colons = count_colons
        self.required = [f.name for f in schema.fields if not f.nullable]
        self.floats = [f.name for f in schema.fields if isinstance(f.dataType, T.FloatType)]
        self._parse_schema = T.StructType(
            [T.StructField(f.name, f.dataType, True) for f in schema.fields]
            + [T.StructField(CORRUPT, T.StringType(), True)]
        )

    def parse(self, value: Column) -> Column:
        """A struct of the declared fields (plus the corrupt-record marker)."""
        return F.from_json(
            value.cast("string"), self._parse_schema,
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
        )

    def unknown_keys(self, value: Column, parsed: Column | None = None) -> Column:
        """Top-level keys of a JSON object that the schema lacks (NULL: not an object).

        With ``parsed`` (this decoder's :meth:`parse` of the same value) most records skip
        the second JSON parse: every key of a JSON text is followed by a colon, so a
        record with a key outside the schema has more colons than the schema fields it
        filled. Records with no more colons than filled fields get an empty array without
        parsing; the rest (unknown keys, nulls, nested objects, colons inside strings)
        are parsed exactly. The guard only skips records that cannot have an unknown key.

        The colons are counted by lakesink's Java function :data:`COUNT_COLONS` (eight
        bytes at a time) when the session has it, else by Spark's ``split``, which builds a string
        per piece (measured in docs/benchmark.md).
        """
        known = F.array(*[F.lit(n) for n in self.fields]) if self.fields else F.array()
        text = value.cast("string")
        keys = F.array_except(F.json_object_keys(text), known.cast("array<string>"))
        if parsed is None or not self.fields:
            return keys
        if self.count_colons:
            colons = F.call_function(COUNT_COLONS, value.cast("binary"))
        else:  # split on one plain character takes Java's fast path: cheaper than a
            # parse, or than replace/regexp_count
            colons = F.size(F.split(text, ":", -1)) - F.lit(1)
        filled = combine(operator.add, [
            F.when(parsed[name].isNotNull(), F.lit(1)).otherwise(F.lit(0))
            for name in self.fields])
        # null values and records that did not parse take the exact path
        return F.when(parsed.isNotNull() & parsed[CORRUPT].isNull() & (colons <= filled),
                      F.array().cast("array<string>")).otherwise(keys)

    def _float_overflow(self, parsed: Column) -> Column | None:
        """True when a ``float`` field's value only fits a double (Spark makes it ±inf)."""
        inf = F.lit(float("inf"))
        checks = [F.abs(parsed[name]) == inf for name in self.floats]
        return combine(operator.or_, checks) if checks else None

    def _missing_required(self, parsed: Column) -> Column | None:
        """True when a ``nullable: false`` field is null or absent (None: none declared)."""
        checks = [parsed[name].isNull() for name in self.required]
        return combine(operator.or_, checks) if checks else None

    def failure(self, value: Column, parsed: Column, unknown: Column | None = None) -> Column:
        """NULL for a good record; a non-null marker for a record to reject.

        ``unknown`` is :meth:`unknown_keys` when the caller computed it already.
        """
        marker = (
            F.when(value.isNull(), F.lit(NULL_VALUE))
            .when(parsed.isNull(), F.lit(MALFORMED_JSON))
            # Spark's JSON reader turns invalid UTF-8 into U+FFFD: a silent change of
            # the data, so such a value is not JSON (RFC 8259 8.1) and is rejected
            .when(~F.is_valid_utf8(value.cast("string")), F.lit(MALFORMED_JSON))
            .when(lone_surrogate(value.cast("string")), F.lit(MALFORMED_JSON))
            .when(parsed[CORRUPT].isNotNull(), F.lit(SCHEMA_MISMATCH))
        )
        overflow = self._float_overflow(parsed)
        if overflow is not None:
            marker = marker.when(overflow, F.lit(SCHEMA_MISMATCH))
        missing = self._missing_required(parsed)
        if missing is not None:
            marker = marker.when(missing, F.lit(MISSING_REQUIRED))
        if self.reject_unknown:
            extra = self.unknown_keys(value) if unknown is None else unknown
            marker = marker.when(F.size(extra) > 0, F.lit(UNKNOWN_FIELD))
        return marker

    def explain(self, value: Column, parsed: Column) -> tuple[Column, Column]:
        """(reason code, human detail) for a rejected record. Costly; rejected rows only."""
        text = value.cast("string")
        variant = F.try_parse_json(text)
        kind = F.schema_of_variant(variant)
        overflow = self._float_overflow(parsed)
        corrupt = parsed[CORRUPT].isNotNull()
        if overflow is not None:
            corrupt = corrupt | overflow
        missing_any = self._missing_required(parsed)
        extra = self.unknown_keys(value)
        reason = (
            F.when(value.isNull(), F.lit(NULL_VALUE))
            .when(variant.isNull() | ~F.is_valid_utf8(text) | lone_surrogate(text),
                  F.lit(MALFORMED_JSON))
            .when(~kind.startswith("OBJECT"), F.lit(NOT_AN_OBJECT))
            .when(corrupt, F.lit(SCHEMA_MISMATCH))
            .when(missing_any if missing_any is not None else F.lit(False),
                  F.lit(MISSING_REQUIRED))
            .when(F.lit(self.reject_unknown) & (F.size(extra) > 0), F.lit(UNKNOWN_FIELD))
            .otherwise(F.lit(SCHEMA_MISMATCH))
        )
        missing = [F.when(parsed[name].isNull(), F.lit(name)) for name in self.required]
        mismatches = []
        for f in self.schema.fields:
            got = F.try_variant_get(variant, _path(f.name), "variant")
            bad = parsed[f.name].isNull() & got.isNotNull() & ~F.is_variant_null(got)
            if f.name in self.floats:
                bad = bad | (F.abs(parsed[f.name]) == F.lit(float("inf")))
            mismatches.append(F.when(
                bad,
                F.concat(F.lit(f"{f.name}: expected {f.dataType.simpleString()}, got "),
                         F.lower(F.schema_of_variant(got)), F.lit(" "),
                         F.substring(F.to_json(got), 1, 60)),
            ))
        detail = (
            F.when(value.isNull(), F.lit("the record has no value (tombstone)"))
            .when(F.length(text) == 0, F.lit("the value is empty"))
            .when(~F.is_valid_utf8(text), F.lit("the value is not valid UTF-8"))
            .when(lone_surrogate(text), F.lit(
                "the value escapes half a UTF-16 surrogate pair (\\uD800-\\uDFFF without "
                "its other half): no Unicode character"))
            .when(variant.isNull(), F.coalesce(_json_error(value),
                                               F.lit("the value is not valid JSON")))
            .when(~kind.startswith("OBJECT"),
                  F.concat(F.lit("expected a JSON object, got "), F.lower(kind)))
            .when(corrupt, F.concat_ws("; ", *mismatches) if mismatches else F.lit(""))
            .when(missing_any if missing_any is not None else F.lit(False),
                  F.concat(F.lit("required field(s) without a value: "),
                           F.concat_ws(", ", *missing) if missing else F.lit("")))
            .otherwise(F.concat(F.lit("field(s) not in the schema: "),
                                F.array_join(F.coalesce(extra, F.array()), ", ")))
        )
        return reason, detail


def _parser_message(raw: bytes | str | None) -> str | None:
    """Python's JSON parser's message and position for the value ``raw`` (None: it
    parses, or it is not UTF-8 text — said by the other reasons)."""
    import json

    if raw is None:
        return None
    try:
        json.loads(raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw)
    except json.JSONDecodeError as exc:
        return (f"the value is not valid JSON: {exc.msg} at line {exc.lineno} column "
                f"{exc.colno} (char {exc.pos})")
    except (ValueError, RecursionError):  # not UTF-8 (UnicodeDecodeError), too deep
        return None
    return None


def _json_error(value: Column) -> Column:
    """:func:`_parser_message` as a column over the raw value (a Python function, so
    it takes the bytes: a string of invalid UTF-8 would fail the worker; dead letters
    only)."""
    # useArrow=False says what it is (a plain Python UDF, as inferred before): left to
    # infer it from the type hints, PySpark 4.2 warns "Cannot infer the eval type from
    # type hints" in the user's log
    return F.udf(_parser_message, T.StringType(), useArrow=False)(value)


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
