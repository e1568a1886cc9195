"""The raw record's shape, spelled once: its Spark DDL, its Arrow schema and its columns.

Pure pyarrow (no pyspark import): the Arrow tasks read it in every Python worker
(:mod:`lakesink.pipeline.arrow_task`); the Python data sources build on it
(:mod:`lakesink.sources.records`).
"""

from __future__ import annotations

import pyarrow as pa

#: the Spark schema of a source's records (without and with headers)
RECORD_DDL = ("key binary, value binary, topic string, partition int, offset long, "
              "timestamp timestamp, timestampType int")
HEADERS_DDL = "headers array<struct<key: string, value: binary>>"

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
_FIELDS = [("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
           ("partition", pa.int32()), ("offset", pa.int64()),
           ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())]
RECORD_SCHEMA = pa.schema(_FIELDS)
#: the record's columns, in order (without headers)
RECORD_COLUMNS = tuple(name for name, _ in _FIELDS)
RECORD_SCHEMA_HEADERS = pa.schema([*_FIELDS, ("headers", HEADER_TYPE)])
