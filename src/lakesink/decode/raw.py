"""Raw payloads as the Danube sink types them: ``string``, ``int64`` and ``bytes``.

* ``string`` -> ``data`` (string). Values that are not valid UTF-8 are rejected
  (``invalid_utf8``) instead of being written with replacement characters.
* ``int64`` -> ``value`` (bigint) from exactly 8 bytes, big-endian, two's complement;
  any other length is rejected (``invalid_length``).
* ``bytes`` -> ``data`` (the bytes as base64 text) and ``size`` (their length).

A null value (tombstone) is rejected as ``null_value`` by all three; an empty value is
a valid empty string / empty bytes, and an invalid length for ``int64``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.decode.base import NULL_VALUE, Decoder

if TYPE_CHECKING:
    from pyspark.sql import Column

INVALID_UTF8 = "invalid_utf8"
INVALID_LENGTH = "invalid_length"


def _null_marker(value: Column) -> Column:
    return F.when(value.isNull(), F.lit(NULL_VALUE))


class StringDecoder(Decoder):
    reasons = (NULL_VALUE, INVALID_UTF8)

    def __init__(self) -> None:
        super().__init__(T.StructType([T.StructField("data", T.StringType(), True)]))

    def parse(self, value: Column) -> Column:
        return F.struct(F.try_validate_utf8(value.cast("string")).alias("data"))

    def failure(self, value: Column, parsed: Column, unknown: Column | None = None) -> Column:
        return _null_marker(value).when(parsed["data"].isNull(), F.lit(INVALID_UTF8))

    def explain(self, value: Column, parsed: Column) -> tuple[Column, Column]:
        reason = self.failure(value, parsed)
        detail = (F.when(value.isNull(), F.lit("the record has no value (tombstone)"))
                  .otherwise(F.concat(F.lit("the value is not valid UTF-8 ("),
                                      F.length(value).cast("string"), F.lit(" bytes)"))))
        return reason, detail


class Int64Decoder(Decoder):
    reasons = (NULL_VALUE, INVALID_LENGTH)

    def __init__(self) -> None:
        super().__init__(T.StructType([T.StructField("value", T.LongType(), True)]))

    def parse(self, value: Column) -> Column:
        # 16 hex digits read as an unsigned 64-bit number; to_base -10 prints it signed
        number = F.conv(F.hex(value), 16, -10).cast("long")
        return F.struct(F.when(F.length(value) == 8, number).alias("value"))

    def failure(self, value: Column, parsed: Column, unknown: Column | None = None) -> Column:
        return _null_marker(value).when(F.length(value) != 8, F.lit(INVALID_LENGTH))

    def explain(self, value: Column, parsed: Column) -> tuple[Column, Column]:
        detail = (F.when(value.isNull(), F.lit("the record has no value (tombstone)"))
                  .otherwise(F.concat(F.lit("expected 8 bytes (big-endian int64), got "),
                                      F.length(value).cast("string"))))
        return self.failure(value, parsed), detail


class BytesDecoder(Decoder):
    def __init__(self) -> None:
        super().__init__(T.StructType([T.StructField("data", T.StringType(), True),
                                       T.StructField("size", T.IntegerType(), True)]))

    def parse(self, value: Column) -> Column:
        return F.struct(F.base64(value).alias("data"), F.length(value).alias("size"))

    def failure(self, value: Column, parsed: Column, unknown: Column | None = None) -> Column:
        return _null_marker(value)

    def explain(self, value: Column, parsed: Column) -> tuple[Column, Column]:
        return _null_marker(value), F.lit("the record has no value (tombstone)")
