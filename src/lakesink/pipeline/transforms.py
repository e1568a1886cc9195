"""Transforms: ``"name: expression"`` pairs applied, in order, to each decoded record.

An expression is Spark SQL over the decoded record's fields and a ``kafka`` struct with
the record's source coordinates::

    kafka.key  kafka.topic  kafka.partition  kafka.offset
    kafka.timestamp  kafka.timestamp_type  kafka.headers

``name`` is the field the result goes to: a new column, an existing one (replaced), or a
dotted path (``meta.kafka.offset``) that adds a field inside a struct column or builds a
new struct column. A later transform sees the fields earlier ones set.

**kafka-delta-ingest strings are accepted.** An expression written in its JMESPath
dialect (a JSON literal in backticks, or one of its ``epoch_*`` helpers) is translated
by :func:`~lakesink.config.transform_text.translate_kdi` (the transforms' text is parsed
and checked by :mod:`lakesink.config.transform_text`, without Spark).

**Per-record failures never stop the stream.** Each expression runs inside Spark's
``TryEval``: an exception of one record (an ANSI cast of a bad value, an overflow,
``raise_error``, ``assert_true``) makes that record's result NULL *and* marks the record
rejected with the reason ``transform_failed`` and the transform that failed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lakesink.config.transform_text import Transform
from lakesink.errors import ConfigError, one_line

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import types as T

TRANSFORM_FAILED = "transform_failed"
#: the marked frame's column holding the index of the first transform that failed
FAILED_INDEX = "_transform_failed"
_RAW = "_lakesink_raw"
# -- Spark -----------------------------------------------------------------------------

def headers_type() -> T.DataType:
    from pyspark.sql import types as T

    return T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                     T.StructField("value", T.BinaryType())]))


def _try(spark: SparkSession, col: Column) -> Column:
    """Spark's TryEval around ``col``: NULL instead of an exception, per row."""
    from pyspark.sql import Column as PyColumn

    jvm = spark._jvm  # type: ignore[attr-defined]
    utils = jvm.org.apache.spark.sql.classic.ExpressionUtils
    expr = jvm.org.apache.spark.sql.catalyst.expressions.TryEval(utils.expression(col._jc))
    return PyColumn(utils.column(expr))


class Transforms:
    """The configured transforms of one table, applied to a marked batch frame."""

    def __init__(self, items: Sequence[Transform], key: str = "table.transforms") -> None:
        self.items = list(items)
        self.key = key

    def __bool__(self) -> bool:
        return bool(self.items)

    @property
    def uses_headers(self) -> bool:
        return any(re.search(r"\bheaders\b", t.expression, re.I) for t in self.items)

    def describe(self, index: int) -> str:
        t = self.items[index]
        return f"transform {index} ({t.text})"

    def apply(self, frame: DataFrame, record: str, out: str) -> DataFrame:
        """``frame`` with the struct column ``out``: ``record`` after the transforms,
        and :data:`FAILED_INDEX`: the first transform that raised for the row, or NULL.

        ``frame`` needs the raw Kafka columns (``key``, ``topic``, ``partition``,
        ``offset``, ``kafka_timestamp``, ``timestampType``; ``headers`` if present).
        Raises ConfigError, naming the transform, when one does not resolve.
        """
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        spark = frame.sparkSession
        rtype = frame.schema[record].dataType
        assert isinstance(rtype, T.StructType)
        names = rtype.fieldNames()
        if any(n.lower() == "kafka" for n in names):
            raise ConfigError(self.key, "the record has a field 'kafka', which transforms "
                              "use for the source coordinates; rename it upstream")
        headers = (F.col("headers") if "headers" in frame.columns
                   else F.lit(None).cast(headers_type()))
        kafka = F.struct(
            F.col("key"), F.col("topic"), F.col("partition"), F.col("offset"),
            F.col("kafka_timestamp").alias("timestamp"),
            F.col("timestampType").alias("timestamp_type"), headers.alias("headers"))
        ctx = frame.select(F.struct(*[F.col(c) for c in frame.columns]).alias(_RAW),
                           *[F.col(record)[n].alias(n) for n in names], kafka.alias("kafka"))
        fails = []
        for i, t in enumerate(self.items):
            tmp = f"_lakesink_t{i}"
            try:
                ctx = ctx.withColumn(tmp, _try(spark, F.struct(F.expr(t.expression).alias("v"))))
                value = F.col(tmp)["v"]
                top = t.target[0]
                current = next((n for n in names if n.lower() == top.lower()), None)
                if len(t.target) > 1:
                    value = _nested(ctx.schema, current, t.target, value)
                elif t.kdi and current is not None:  # kafka-delta-ingest keeps a value
                    value = F.coalesce(value, F.col(current))  # when the result is null
                ctx = ctx.withColumn(current or top, value)
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - Spark's analysis errors
                message = one_line(exc, name=False) or repr(exc)
                raise ConfigError(f"{self.key}.{i}", f"{t.text!r}: {message}") from None
            if current is None:
                names.append(top)
            fails.append(F.when(F.col(tmp).isNull(), F.lit(i)))
        return ctx.select(f"{_RAW}.*", F.struct(*[F.col(n) for n in names]).alias(out),
                          F.coalesce(*fails).alias(FAILED_INDEX))

    def output_schema(self, spark: SparkSession, schema: T.StructType) -> T.StructType:
        """The record's type after the transforms (analysis only, no job)."""
        from pyspark.sql import types as T

        raw = T.StructType([
            T.StructField("key", T.BinaryType()), T.StructField("value", T.BinaryType()),
            T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
            T.StructField("offset", T.LongType()),
            T.StructField("kafka_timestamp", T.TimestampType()),
            T.StructField("timestampType", T.IntegerType()),
            T.StructField("_r", schema),
        ])
        frame = spark.createDataFrame([], raw)
        out = self.apply(frame, "_r", "_t").schema["_t"].dataType
        assert isinstance(out, T.StructType)
        return out


def _nested(schema: T.StructType, current: str | None, target: tuple[str, ...],
            value: Column) -> Column:
    """``value`` placed at ``target`` (dotted): a field added to (or replaced in) an
    existing struct column, or a new struct column built around it."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    def around(parts: Sequence[str], col: Column) -> Column:
        for part in reversed(parts):
            col = F.struct(col.alias(part))
        return col

    if current is None:
        return around(target[1:], value)
    dtype = schema[current].dataType
    path: list[str] = []
    for depth, part in enumerate(target[1:], start=1):
        if not isinstance(dtype, T.StructType):
            where = ".".join((current, *path))
            raise ValueError(f"{where!r} is a {dtype.simpleString()}, not a struct: a "
                             "dotted name needs struct columns")
        match = next((f for f in dtype.fields if f.name.lower() == part.lower()), None)
        if match is None or depth == len(target) - 1:  # add here (or replace the leaf)
            name = match.name if match is not None else part
            return F.col(current).withField(".".join((*path, name)),
                                            around(target[depth + 1:], value))
        path.append(match.name)
        dtype = match.dataType
    raise AssertionError("unreachable: the loop returns at the leaf")
