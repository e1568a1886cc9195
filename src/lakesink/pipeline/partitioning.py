"""Partition columns: payload fields plus ``year/month/day/hour`` from a timestamp.

Rules (the same as the Quix sink's, made per value and safe):

* An epoch number's unit is told apart **per value** by magnitude: ``|v| >= 1e17`` is
  nanoseconds, ``>= 1e14`` microseconds, ``>= 1e11`` milliseconds, else seconds.
  Numeric strings follow the same rule; other strings are parsed as ISO-8601.
  Everything is UTC.
* ``year`` is four digits; ``month``, ``day`` and ``hour`` are zero-padded to two.
* A null partition value goes to the folder ``<col>=<null_partition_value>``
  (default ``__HIVE_DEFAULT_PARTITION__``, what Spark, Hive and DuckDB read as NULL).
* Folder values are Hive-escaped (``/`` -> ``%2F``, ``=`` -> ``%3D``, …), so no value can
  change the path: a folder is always ``<col>=<escaped value>``, and ``..`` stays a
  value inside it.

:func:`detect_unit`, :func:`to_utc` and :func:`partition_path` are the reference
implementation in plain Python; the Spark expressions below are built from the same
thresholds, and integration tests check that Spark's folders match these functions.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from lakesink.tables.paths import (
    ESCAPE_CLASS,
    HIVE_DEFAULT_PARTITION,
    MAX_FOLDER_BYTES,
    escape_value,
)

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType

#: (lower bound of |value|, unit, microseconds per unit) from largest to smallest.
UNIT_THRESHOLDS: tuple[tuple[float, str, float], ...] = (
    (1e17, "ns", 1e-3),
    (1e14, "us", 1.0),
    (1e11, "ms", 1e3),
    (0.0, "s", 1e6),
)
TIME_PARTS: dict[str, str] = {"year": "yyyy", "month": "MM", "day": "dd", "hour": "HH"}


def detect_unit(value: float) -> str:
    """The epoch unit of one value: ``'ns'``, ``'us'``, ``'ms'`` or ``'s'``."""
    magnitude = abs(value)
    for bound, unit, _ in UNIT_THRESHOLDS:
        if magnitude >= bound:
            return unit
    return "s"


def to_utc(value: int | float | str | dt.datetime | None) -> dt.datetime | None:
    """Interpret an epoch number (any unit), a numeric string or ISO-8601 text as UTC."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, str):
        text = value.strip()
        try:
            number = float(text)
        except ValueError:
            parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
            return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(
                dt.UTC
            )
        value = number
    unit = detect_unit(value)
    per = next(p for _, u, p in UNIT_THRESHOLDS if u == unit)
    micros = int(value * per) if unit != "us" else int(value)
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)


def time_parts(ts: dt.datetime | None) -> dict[str, str | None]:
    if ts is None:
        return dict.fromkeys(TIME_PARTS)
    return {
        "year": f"{ts.year:04d}", "month": f"{ts.month:02d}",
        "day": f"{ts.day:02d}", "hour": f"{ts.hour:02d}",
    }


def partition_path(
    values: Mapping[str, object | None], columns: Sequence[str], *,
    null_value: str = HIVE_DEFAULT_PARTITION,
) -> str:
    """``{"location": "a/b", "year": "2026"}`` -> ``location=a%2Fb/year=2026``."""
    parts = []
    for col in columns:
        value = values.get(col)
        text = null_value if value is None or value == "" else str(value)
        parts.append(f"{escape_value(col)}={escape_value(text)}")
    return "/".join(parts)


# -- Spark expressions -------------------------------------------------------------------


def _epoch_to_timestamp(number: Column) -> Column:
    from pyspark.sql import functions as F

    d = number.cast("double")
    micros = None
    for bound, _unit, per in UNIT_THRESHOLDS:
        cond = F.abs(d) >= F.lit(bound)
        expr = d * F.lit(per)
        micros = F.when(cond, expr) if micros is None else micros.when(cond, expr)
    assert micros is not None
    return F.timestamp_micros(F.floor(micros).cast("long"))


def check_timestamp_type(dtype: DataType) -> None:
    """Raise TypeError unless a column of ``dtype`` can be read as a timestamp."""
    from pyspark.sql import types as T

    if not isinstance(dtype, (T.TimestampType, T.TimestampNTZType, T.DateType, T.NumericType,
                              T.StringType)):
        raise TypeError(f"a {dtype.simpleString()} column cannot be a timestamp")


def timestamp_column_expr(col: Column, dtype: DataType) -> Column:
    """A Spark timestamp (UTC) from a payload timestamp column of any supported type.

    Returns NULL when the value is NULL **or** cannot be interpreted; callers tell the
    two apart by checking the source column for NULL.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, (T.TimestampType, T.TimestampNTZType)):
        return col.cast("timestamp")
    if isinstance(dtype, T.DateType):  # its midnight UTC (a cast: the session zone's)
        return F.timestamp_micros(F.unix_date(col).cast("long") * 86_400_000_000)
    if isinstance(dtype, T.NumericType):
        return _epoch_to_timestamp(col)
    if isinstance(dtype, T.StringType):
        trimmed = F.trim(col)
        number = trimmed.try_cast("double")
        return F.when(number.isNotNull(), _epoch_to_timestamp(number)).otherwise(
            trimmed.try_cast("timestamp")
        )
    check_timestamp_type(dtype)
    raise AssertionError("unreachable")


def folder_unfit_expr(col: str, value: Column, *, ascii_only: bool = False) -> Column:
    """Spark's :func:`folder_fits`, negated: true when the string ``value`` cannot name
    a folder of ``col`` (false for null). The exact length is computed only for values
    long enough to matter."""
    from pyspark.sql import functions as F

    prefix = len(f"{escape_value(col, ascii_only=ascii_only)}=".encode())
    size = F.octet_length(value)
    escaped = F.length(value) - F.length(F.regexp_replace(value, ESCAPE_CLASS, ""))
    if ascii_only:  # and each byte of a non-ASCII character: %XX
        escaped = escaped + size - F.length(F.regexp_replace(value, "[^\\x00-\\x7F]", ""))
    too_long = F.when(size * 3 + prefix > MAX_FOLDER_BYTES,
                      size + escaped * 2 + prefix > MAX_FOLDER_BYTES).otherwise(False)
    return F.coalesce(too_long | (F.instr(value, "\x00") > 0), F.lit(False))


def time_part_exprs(ts: Column) -> dict[str, Column]:
    """``year``, ``month``, ``day``, ``hour`` strings (zero-padded) of a timestamp, in UTC
    whatever Spark's session time zone (``F.year``/``F.hour`` of a timestamp would use
    it): the day and the hour come from its microseconds since the epoch, in integer
    arithmetic, and the year/month/day from that day as a date (dates have no zone).

    Integer fields padded with ``lpad`` rather than ``date_format``: the same strings
    (as ``TIME_PARTS`` spells them), without a date formatter per row, which made
    ``date_format`` the most expensive expression of the whole batch.
    """
    from pyspark.sql import functions as F

    day_us = 86_400_000_000
    # an epoch of -Infinity is the smallest long (see _epoch_to_timestamp): kept a day
    # above it, so that the subtraction below cannot overflow (an ANSI error)
    raw, floor_us = F.unix_micros(ts), F.lit(-(2**63) + day_us)
    micros = F.when(raw < floor_us, floor_us).otherwise(raw)  # null stays null
    into_day = F.pmod(micros, F.lit(day_us))  # 0 ≤ µs since midnight UTC, also before 1970
    date = F.date_from_unix_date(F.round((micros - into_day) / day_us).cast("int"))
    fields = {"year": (F.year(date), 4), "month": (F.month(date), 2),
              "day": (F.dayofmonth(date), 2),
              "hour": (F.floor(into_day / 3_600_000_000), 2)}
    return {name: F.lpad(value.cast("string"), width, "0")
            for name, (value, width) in fields.items()}