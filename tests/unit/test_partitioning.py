"""Timestamp unit detection, time partitions and path escaping (no Spark)."""

from __future__ import annotations

import datetime as dt

import pytest

from lakesink.pipeline.partitioning import detect_unit, partition_path, time_parts, to_utc
from lakesink.tables.paths import (
    HIVE_DEFAULT_PARTITION,
    MAX_FOLDER_BYTES,
    ascii_name,
    escape_value,
    folder_fits,
    is_safe_relative_dir,
    unescape_value,
)

INSTANT = dt.datetime(2026, 11, 25, 7, 5, 9, 123456, tzinfo=dt.UTC)
EPOCH_S = 1795590309.123456


@pytest.mark.parametrize(
    ("value", "unit"),
    [
        (0, "s"), (1, "s"), (99_999_999_999, "s"), (100_000_000_000, "ms"),
        (1_795_590_309_123, "ms"), (99_999_999_999_999, "ms"), (100_000_000_000_000, "us"),
        (1_795_590_309_123_456, "us"), (100_000_000_000_000_000, "ns"),
        (1_795_590_309_123_456_789, "ns"), (-1_795_590_309_123, "ms"), (1_795_590_309.5, "s"),
    ],
)
def test_detect_unit(value: float, unit: str) -> None:
    assert detect_unit(value) == unit


@pytest.mark.parametrize(
    "value",
    [1795590309, 1795590309123, 1795590309123456, 1795590309123456789, "1795590309123",
     "2026-11-25T07:05:09Z", "2026-11-25T08:05:09+01:00", "2026-11-25 07:05:09",
     "2026-11-25T07:05:09.123456Z"],
)
def test_every_unit_lands_in_the_same_hour(value: object) -> None:
    ts = to_utc(value)  # type: ignore[arg-type]
    assert ts is not None
    assert (ts.year, ts.month, ts.day, ts.hour) == (2026, 11, 25, 7)


def test_units_agree_to_the_microsecond() -> None:
    ms = to_utc(1795590309123)
    us = to_utc(1795590309123456)
    ns = to_utc(1795590309123456789)
    assert ms == INSTANT.replace(microsecond=123000)
    assert us == INSTANT
    assert ns == INSTANT


def test_time_parts_are_zero_padded() -> None:
    parts = time_parts(dt.datetime(2026, 1, 2, 3, tzinfo=dt.UTC))
    assert parts == {"year": "2026", "month": "01", "day": "02", "hour": "03"}
    assert time_parts(None) == {"year": None, "month": None, "day": None, "hour": None}


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [("plain", "plain"), ("a/b", "a%2Fb"), ("k=v", "k%3Dv"), ("..", ".."), ("../x", "..%2Fx"),
     ("50%", "50%25"), ("a:b", "a%3Ab"), ("new\nline", "new%0Aline"), ("späti", "späti")],
)
def test_escape_value(raw: str, escaped: str) -> None:
    assert escape_value(raw) == escaped
    assert unescape_value(escaped) == raw


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [("plain", "plain"), ("späti", "sp%C3%A4ti"), ("50% ü", "50%25 %C3%BC"),
     ("日本/x", "%E6%97%A5%E6%9C%AC%2Fx"), ("🦀", "%F0%9F%A6%80"), ("a b", "a b")],
)
def test_a_delta_folder_is_named_in_ascii_and_read_back(raw: str, escaped: str) -> None:
    """A Delta table's folders (``ascii_only``): Hive's escaping, then each non-ASCII
    character as its UTF-8 bytes, as delta-rs names folders; either spelling reads back
    (a Spark-written folder keeps its raw characters)."""
    assert escape_value(raw, ascii_only=True) == escaped
    assert escaped.isascii()
    assert unescape_value(escaped) == raw == unescape_value(escape_value(raw))
    assert ascii_name(escape_value(raw)) == escaped


def test_a_delta_folder_s_length_counts_its_ascii_name() -> None:
    """A value that fits a folder in Spark's spelling may not once in ASCII: in a Delta
    table it is a dead letter on both engines (the rule Spark's expression shares)."""
    value = "é" * 120  # 240 bytes raw, 720 as %XX
    assert folder_fits("location", value)
    assert not folder_fits("location", value, ascii_only=True)
    longest = "é" * ((MAX_FOLDER_BYTES - len("location=")) // 6)
    assert folder_fits("location", longest, ascii_only=True)
    assert not folder_fits("location", longest + "é", ascii_only=True)


def test_partition_path_never_leaves_its_folder() -> None:
    path = partition_path({"location": "../../etc", "kind": "a=b/c"}, ["location", "kind"])
    assert path == "location=..%2F..%2Fetc/kind=a%3Db%2Fc"
    assert path.count("/") == 1
    assert is_safe_relative_dir(path, ["location", "kind"])


def test_null_and_empty_go_to_the_default_folder() -> None:
    assert partition_path({"a": None, "b": ""}, ["a", "b"]) == (
        f"a={HIVE_DEFAULT_PARTITION}/b={HIVE_DEFAULT_PARTITION}")
    assert partition_path({"a": None}, ["a"], null_value="__None__") == "a=__None__"


@pytest.mark.parametrize(
    "rel",
    ["location=x", "location=x/day=1/extra=2", "day=1/location=x", "location=/day=1",
     "location=x/..", "../location=x/day=1"],
)
def test_unsafe_relative_dirs_are_refused(rel: str) -> None:
    assert not is_safe_relative_dir(rel, ["location", "day"])


def test_a_null_folder_value_that_cannot_name_a_folder_is_refused_at_start() -> None:
    """``table.null_partition_value`` names a folder too: one that no file system takes
    would fail every batch with a null value, so it stops the start (exit 2)."""
    from pyspark.sql import types as T

    from lakesink.errors import ConfigError
    from lakesink.pipeline.columns import PartitionSpec

    schema = T.StructType([T.StructField("location", T.StringType())])
    PartitionSpec.build(columns=["location"], schema=schema, timestamp_column=None,
                        null_value="none")
    for bad in ("a\x00b", "x" * 250):
        with pytest.raises(ConfigError) as refused:
            PartitionSpec.build(columns=["location"], schema=schema, timestamp_column=None,
                                null_value=bad)
        assert refused.value.key == "table.null_partition_value"
