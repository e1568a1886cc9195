"""Avro payloads with Spark's ``from_avro`` (spark-avro), against a schema file.

The writer schema comes from ``decode.avro.schema_file``; its top level must be a
record, whose fields become the table's columns (Spark's Avro type mapping). With
``wire: confluent`` every value starts with the Confluent framing — magic byte ``0``
and a 4-byte schema id — which is checked and stripped (the id itself is not looked up:
the schema file is the schema). Rejections:

* ``null_value``: a tombstone;
* ``bad_magic_byte``: ``wire: confluent`` and the value is shorter than 5 bytes or
  does not start with ``0``;
* ``malformed_avro``: the datum cannot be read with the schema. ``from_avro`` in
  PERMISSIVE mode returns a row of NULLs for it, so a NULL in a field the schema does
  not allow to be null marks the failure; when every field is nullable, an all-NULL row
  counts as read only if it encodes back (``to_avro``) to the same bytes. A datum read
  with bytes left after it is malformed too: ``from_avro`` reads one datum and ignores
  what follows (known-open L15), so a value written with a schema of more fields than
  the schema file (those fields were dropped silently) or two data in one value went
  in as a row. The datum's length is its re-encoding's (``to_avro`` with the same
  schema: Avro's binary encoding of a value is one byte string for every writer that
  writes each array and map as one block, as the Java, Python, fastavro and Rust
  writers do; ``decode.avro.check_length: false`` turns the check off for a writer that
  does not).

Avro carries no field names or checksums, so some wrong inputs still decode (for
example random bytes against a schema of one ``long``); that is Avro's nature, the same
in every Avro reader.
"""

from __future__ import annotations

import json
import operator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.decode.base import (
    BAD_MAGIC_BYTE,
    CONFLUENT_HEADER,
    NULL_VALUE,
    Decoder,
    combine,
    confluent_framed,
    framing_detail,
)
from lakesink.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

MALFORMED_AVRO = "malformed_avro"


def read_schema_file(path: str) -> str:
    """The schema text, checked to be JSON whose top level is a record."""
    try:
        text = Path(path).read_text()
        parsed = json.loads(text)
    except OSError as exc:
        raise ConfigError("decode.avro.schema_file", f"cannot read {path}: {exc}") from None
    except ValueError as exc:
        raise ConfigError("decode.avro.schema_file", f"{path} is not JSON: {exc}") from None
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise ConfigError("decode.avro.schema_file",
                          f"{path}: the top-level type must be a record (its fields become "
                          "the columns)")
    return text


def _nullable(avro_type: Any) -> bool:
    if isinstance(avro_type, list):
        return any(_nullable(t) for t in avro_type)
    if isinstance(avro_type, dict):
        return avro_type.get("type") == "null"
    return avro_type == "null"


class AvroDecoder(Decoder):
    reasons = (NULL_VALUE, BAD_MAGIC_BYTE, MALFORMED_AVRO)

    def __init__(self, spark: SparkSession, schema_json: str, *, wire: str = "plain",
                 check_length: bool = True) -> None:
        self.schema_json = schema_json
        self.check_length = check_length
        fields = json.loads(schema_json).get("fields", [])
        self.required = [f["name"] for f in fields if not _nullable(f.get("type"))]
        self.confluent = wire == "confluent"
        # Spark's type mapping of the Avro schema, read off an empty projection
        probe = spark.range(0).select(self._from_avro(F.lit(None).cast("binary")).alias("r"))
        struct = probe.schema["r"].dataType
        assert isinstance(struct, T.StructType)
        super().__init__(T.StructType([T.StructField(f.name, f.dataType, True)
                                       for f in struct.fields]))

    def _from_avro(self, payload: Column) -> Column:
        from pyspark.sql.avro.functions import from_avro

        return from_avro(payload, self.schema_json, {"mode": "PERMISSIVE"})

    def _framed(self, value: Column) -> Column:
        """True when the Confluent header is present (always True for plain values)."""
        return confluent_framed(value) if self.confluent else F.lit(True)

    def _payload(self, value: Column) -> Column:
        if not self.confluent:
            return value
        return F.substring(value, CONFLUENT_HEADER + 1, 2**31 - 1)

    def parse(self, value: Column) -> Column:
        if not self.confluent:
            return self._from_avro(value)
        return F.when(self._framed(value), self._from_avro(self._payload(value)))

    def _unreadable(self, value: Column, parsed: Column) -> Column:
        """True when from_avro gave its failure row (see the module docstring)."""
        from pyspark.sql.avro.functions import to_avro

        if self.required:
            return combine(operator.or_, [parsed[n].isNull() for n in self.required])
        if not self.fields:
            return parsed.isNull()
        all_null = combine(operator.and_, [parsed[n].isNull() for n in self.fields])
        # evaluated only for all-NULL rows: does the NULL row encode to these bytes?
        return parsed.isNull() | F.when(
            all_null, to_avro(parsed, self.schema_json) != self._payload(value)
        ).otherwise(F.lit(False))

    def _left_over(self, value: Column, parsed: Column) -> Column:
        """Bytes after the datum read (see the module docstring); evaluated only for a
        value read (its re-encoding needs the required fields)."""
        from pyspark.sql.avro.functions import to_avro

        return F.length(self._payload(value)) - F.length(to_avro(parsed, self.schema_json))

    def failure(self, value: Column, parsed: Column, unknown: Column | None = None) -> Column:
        marked = (F.when(value.isNull(), F.lit(NULL_VALUE))
                  .when(~self._framed(value), F.lit(BAD_MAGIC_BYTE))
                  .when(self._unreadable(value, parsed), F.lit(MALFORMED_AVRO)))
        if self.check_length:
            marked = marked.when(self._left_over(value, parsed) > 0, F.lit(MALFORMED_AVRO))
        return marked

    def explain(self, value: Column, parsed: Column) -> tuple[Column, Column]:
        size = F.length(value).cast("string")
        detail = (
            F.when(value.isNull(), F.lit("the record has no value (tombstone)"))
            .when(~self._framed(value), framing_detail(value))
            .when(self._unreadable(value, parsed),
                  F.concat(F.lit("the value cannot be read with the Avro schema ("),
                           size, F.lit(" bytes)")))
        )
        if self.check_length:
            detail = detail.otherwise(F.concat(
                (self._left_over(value, parsed)).cast("string"),
                F.lit(" byte(s) follow the Avro datum ("), size,
                F.lit(" bytes): written with a schema of more fields than the schema "
                      "file, or more than one datum in the value")))
        return self.failure(value, parsed), detail
