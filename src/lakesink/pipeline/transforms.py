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
by :func:`translate_kdi` — the pure part of this module, tested without Spark.

**Per-record failures never stop the stream.** Each expression runs inside Spark's
``TryEval``: an exception of one record (an ANSI cast of a bad value, an overflow,
``raise_error``, ``assert_true``) makes that record's result NULL *and* marks the record
rejected with the reason ``transform_failed`` and the transform that failed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakesink.errors import ConfigError, one_line

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import types as T

TRANSFORM_FAILED = "transform_failed"
#: the marked frame's column holding the index of the first transform that failed
FAILED_INDEX = "_transform_failed"
_RAW = "_lakesink_raw"
_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_KDI_FUNCTIONS = ("substr", "epoch_seconds_to_iso8601", "epoch_millis_to_iso8601",
                  "epoch_micros_to_iso8601", "epoch_millis_to_micro")
_ISO_SECONDS = "yyyy-MM-dd'T'HH:mm:ss"


@dataclass(frozen=True)
class Transform:
    """One parsed transform. ``expression`` is Spark SQL (translated if ``kdi``)."""

    target: tuple[str, ...]
    expression: str
    text: str
    kdi: bool = False

    @property
    def name(self) -> str:
        return ".".join(self.target)


def parse_transforms(items: Sequence[str], key: str = "table.transforms") -> list[Transform]:
    """Parse ``"name: expression"`` strings; a ConfigError names ``key.i`` on the first
    bad one. No Spark: the expressions are checked against the schema at start."""
    out = []
    for i, text in enumerate(items):
        where = f"{key}.{i}"
        name, sep, expr = text.partition(":")
        name, expr = name.strip(), expr.strip()
        if not sep or not name or not expr:
            raise ConfigError(where, f"{text!r} is not 'name: expression'")
        if not _TARGET.match(name):
            raise ConfigError(where, f"{name!r} is not a column name or a dotted path of them")
        top = name.split(".")[0]
        if top.lower() == "kafka" or top.startswith("_lakesink"):
            raise ConfigError(where, f"{name!r}: 'kafka' and '_lakesink*' are reserved names")
        kdi = is_kdi(expr)
        try:
            sql = translate_kdi(expr) if kdi else expr
        except ValueError as exc:
            raise ConfigError(where, f"{expr!r}: {exc}") from None
        out.append(Transform(tuple(name.split(".")), sql, text, kdi))
    return out


# -- kafka-delta-ingest's JMESPath dialect --------------------------------------------

_LITERAL = re.compile(r"`((?:[^`\\]|\\.)*)`")


def is_kdi(expr: str) -> bool:
    """A kafka-delta-ingest (JMESPath) expression: it holds a JSON literal in backticks
    (in Spark SQL a backtick quotes a column name, never a number or a quoted string) or
    calls one of kafka-delta-ingest's ``epoch_*`` helpers."""
    for m in _LITERAL.finditer(expr):
        try:
            value = json.loads(m.group(1))
        except ValueError:
            continue
        if value is None or isinstance(value, (bool, int, float, str)):
            return True
    return bool(re.search(r"\bepoch_(seconds|millis|micros)_to_(iso8601|micro)\s*\(", expr))


def translate_kdi(expr: str) -> str:
    """kafka-delta-ingest's transform source -> Spark SQL.

    * ```0``` (JSON literal) -> ``0``; ```"a"``` -> ``'a'``; ``'raw'`` stays;
      ``"name"`` (a JMESPath quoted identifier) -> ```name```;
    * ``substr(s, skip, take)`` -> ``substring(s, skip + 1, take)``;
    * ``epoch_{seconds,millis,micros}_to_iso8601(n)`` -> the UTC ISO-8601 text
      (``2021-07-20T23:18:18Z``; milli/microseconds shown when not zero);
    * ``epoch_millis_to_micro(n)`` -> ``n * 1000``;
    * paths (``a.b.c``) and ``kafka.*`` are the same in both.

    Raises ValueError for JMESPath that has no Spark SQL equivalent here
    (projections, filters, pipes, multi-selects, ``@`` and ``&``).
    """
    tokens = _tokens(expr)
    for kind, text in tokens:
        if kind == "op" and text in ("[", "]", "|", "@", "&", "{", "}", "?"):
            raise ValueError(f"JMESPath {text!r} (projections, filters, pipes, multi-select) "
                             "has no translation; write the transform in Spark SQL")
    out, _ = _translate(tokens, 0, stop=None)
    return out


def _tokens(expr: str) -> list[tuple[str, str]]:
    """(kind, text): kind is lit (a translated literal), ident, op, or space."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "`":
            m = _LITERAL.match(expr, i)
            if m is None:
                raise ValueError("an unclosed ` literal")
            out.append(("lit", _sql_literal(m.group(1).replace("\\`", "`"))))
            i = m.end()
        elif c in "'\"":
            j = i + 1
            while j < len(expr) and expr[j] != c:
                j += 2 if expr[j] == "\\" else 1
            if j >= len(expr):
                raise ValueError(f"an unclosed {c} quote")
            body = expr[i + 1:j]
            if c == "'":  # a JMESPath raw string: a Spark string literal
                out.append(("lit", "'" + body.replace("\\'", "'").replace("\\", "\\\\")
                            .replace("'", "\\'") + "'"))
            else:  # a quoted identifier
                out.append(("ident", "`" + json.loads(expr[i:j + 1]).replace("`", "``") + "`"))
            i = j + 1
        elif c.isspace():
            j = i
            while j < len(expr) and expr[j].isspace():
                j += 1
            out.append(("space", expr[i:j]))
            i = j
        elif c.isalnum() or c == "_":
            j = i
            while j < len(expr) and (expr[j].isalnum() or expr[j] == "_"):
                j += 1
            out.append(("ident", expr[i:j]))
            i = j
        else:
            out.append(("op", c))
            i += 1
    return out


def _sql_literal(body: str) -> str:
    try:
        value = json.loads(body)
    except ValueError:
        raise ValueError(f"`{body}` is not a JSON literal") from None
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise ValueError(f"`{body}`: only scalar JSON literals have a translation")


def _translate(tokens: list[tuple[str, str]], i: int, stop: set[str] | None
               ) -> tuple[str, int]:
    """Translate from ``tokens[i]`` up to (not including) an op in ``stop`` at depth 0."""
    out: list[str] = []
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "op" and stop is not None and text in stop:
            break
        if kind == "ident" and text in _KDI_FUNCTIONS:
            j = i + 1
            while j < len(tokens) and tokens[j][0] == "space":
                j += 1
            if j < len(tokens) and tokens[j] == ("op", "("):
                args, i = _arguments(tokens, j + 1)
                out.append(_call(text, args))
                continue
        if kind == "op" and text == "(":
            inner, i = _translate(tokens, i + 1, stop={")"})
            if i >= len(tokens):
                raise ValueError("an unclosed '('")
            out.append(f"({inner})")
            i += 1
            continue
        out.append(text)
        i += 1
    return "".join(out), i


def _arguments(tokens: list[tuple[str, str]], i: int) -> tuple[list[str], int]:
    """Arguments of a call whose '(' precedes ``tokens[i]``; returns them and the index
    after the closing ')'."""
    args = []
    while True:
        arg, i = _translate(tokens, i, stop={",", ")"})
        if i >= len(tokens):
            raise ValueError("an unclosed '('")
        args.append(arg.strip())
        if tokens[i][1] == ")":
            return args, i + 1
        i += 1


def _call(name: str, args: list[str]) -> str:
    want = 3 if name == "substr" else 1
    if len(args) != want or not all(args):
        raise ValueError(f"{name} takes {want} argument(s), got {len(args)}")
    if name == "substr":
        s, skip, take = args
        return f"substring({s}, ({skip}) + 1, {take})"
    (n,) = args
    if name == "epoch_millis_to_micro":
        return f"(cast({n} AS BIGINT) * 1000)"
    unit = name.split("_")[1]  # seconds | millis | micros
    value = f"cast({n} AS BIGINT)"
    if unit == "seconds":
        return f'date_format(timestamp_seconds({value}), "{_ISO_SECONDS}\'Z\'")'
    scale, fraction = (1000, "SSS") if unit == "millis" else (1_000_000, "SSSSSS")
    ts = f"timestamp_{unit}({value})"
    return (f"CASE WHEN {value} % {scale} = 0 THEN date_format({ts}, \"{_ISO_SECONDS}'Z'\") "
            f"ELSE date_format({ts}, \"{_ISO_SECONDS}.{fraction}'Z'\") END")


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
