"""The record every source yields: the shape of Spark's Kafka source.

Decoding, routing, transforms, partitions, the dead-letter table and silence detection
read these columns, so a source that yields them works with all of them unchanged:

============  ==========================================================================
column        meaning
============  ==========================================================================
key           bytes or null
value         the payload bytes; null when the source record has none (a tombstone,
              rejected by every decoder)
topic         the source's name for where the record came from (a Kafka topic, a Redis
              key); routes match it
partition     a Kafka partition; 0 for Redis
offset        the record's position, unique and increasing within (topic, partition)
timestamp     the record's time (UTC)
timestampType 0 create time, 1 log-append time (Redis: the entry id's time)
headers       (optional) ``array<struct<key string, value binary>>``
============  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader

from lakesink.sources.record_shape import (
    HEADER_TYPE,
    HEADERS_DDL,
    RECORD_DDL,
    RECORD_SCHEMA,
    RECORD_SCHEMA_HEADERS,
)

def record_ddl(headers: bool) -> str:
    return f"{RECORD_DDL}, {HEADERS_DDL}" if headers else RECORD_DDL


def record_batch(*, keys: Sequence[bytes | None], values: Sequence[bytes | None], topic: str,
                 offsets: Sequence[int], times_ms: Sequence[int], timestamp_type: int,
                 headers: Sequence[list[tuple[str, bytes]]] | None = None) -> pa.RecordBatch:
    """One Arrow batch of records from one topic (partition 0)."""
    n = len(values)
    arrays = [pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
              pa.array([topic] * n, pa.string()), pa.array([0] * n, pa.int32()),
              pa.array(offsets, pa.int64()),
              pa.array([t * 1000 for t in times_ms], pa.int64()).cast(
                  pa.timestamp("us", tz="UTC")),
              pa.array([timestamp_type] * n, pa.int32())]
    if headers is None:
        return pa.RecordBatch.from_arrays(arrays, schema=RECORD_SCHEMA)
    arrays.append(pa.array([[{"key": k, "value": v} for k, v in h] for h in headers],
                           HEADER_TYPE))
    return pa.RecordBatch.from_arrays(arrays, schema=RECORD_SCHEMA_HEADERS)


class RecordSource(DataSource):
    """A Spark Python data source of these records: a subclass names its ``format`` and
    its stream ``reader`` class (which gets the options as a dict); the option
    ``headers`` (``true``) adds the headers column."""

    format: ClassVar[str]
    reader: ClassVar[Any]

    @classmethod
    def name(cls) -> str:
        return cls.format

    def schema(self) -> str:
        return record_ddl(self.options.get("headers") == "true")

    def streamReader(self, schema: object) -> DataSourceStreamReader:
        return self.reader(dict(self.options))
