"""Arrow IPC payloads: each value is an Arrow IPC *stream* (a schema and one or more
record batches), so one record gives any number of table rows.

The table's columns are ``decode.schema`` (declared). Each value's columns are matched
by name and cast to the declared types with Arrow's safe casts; a declared column the
stream lacks is NULL; columns the schema does not declare are ignored. Decoding runs
in one Arrow UDF per batch (``pyarrow.ipc``, vectorised per value); Spark has no IPC
reader function.

Rejections (one dead letter per record, whatever its row count):

* ``null_value``: a tombstone;
* ``malformed_arrow``: the value is not an Arrow IPC stream;
* ``schema_mismatch``: a column cannot be cast to its declared type (the ``detail``
  names it), or a ``nullable: false`` column holds NULLs.

A stream with zero rows is a record that writes nothing (not a dead letter).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.decode.base import NULL_VALUE, Decoder

if TYPE_CHECKING:
    from pyspark.sql import Column

MALFORMED_ARROW = "malformed_arrow"
SCHEMA_MISMATCH = "schema_mismatch"
_ROWS, _REASON, _ERROR = "rows", "_lakesink_reason", "_lakesink_error"


class _Mismatch(Exception):
    pass


class _Converter:
    """The UDF body: a batch of IPC streams -> ``struct<rows, reason, error>``."""

    def __init__(self, schema: T.StructType) -> None:
        self.schema = schema
        self._target: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_target": None}

    def _conform(self, table: pa.Table) -> pa.StructArray:
        import pyarrow.compute as pc

        columns = []
        for field, spark_field in zip(self._target, self.schema.fields, strict=True):
            if field.name in table.column_names:
                col = table.column(field.name).combine_chunks()
                try:
                    col = pc.cast(col, field.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise _Mismatch(f"column {field.name!r}: cannot read {col.type} as "
                                    f"{spark_field.dataType.simpleString()} ({exc})") from None
            else:
                col = pa.nulls(table.num_rows, field.type)
            if not spark_field.nullable and col.null_count:
                raise _Mismatch(f"column {field.name!r} is declared not nullable but holds "
                                f"{col.null_count} NULL(s)")
            columns.append(col)
        return pa.StructArray.from_arrays(columns, fields=list(self._target))

    def __call__(self, values: pa.Array) -> pa.Array:
        from pyspark.sql.pandas.types import to_arrow_type

        if self._target is None:
            self._target = to_arrow_type(self.schema, timezone="UTC")
        chunks, offsets, nulls, reasons, errors = [], [0], [], [], []
        for data in values.to_pylist():
            reason = error = None
            rows = None
            if data is not None:
                try:
                    rows = self._conform(pa.ipc.open_stream(pa.py_buffer(data)).read_all())
                except _Mismatch as exc:
                    reason, error = SCHEMA_MISMATCH, str(exc)
                except Exception as exc:  # noqa: BLE001 - any read error is the record's
                    reason, error = MALFORMED_ARROW, f"{type(exc).__name__}: {exc}"[:500]
            if rows is not None:
                chunks.append(rows)
            offsets.append(offsets[-1] + (len(rows) if rows is not None else 0))
            nulls.append(rows is None)
            reasons.append(reason)
            errors.append(error)
        flat = pa.concat_arrays(chunks) if chunks else pa.array([], type=self._target)
        lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat,
                                         mask=pa.array(nulls, pa.bool_()))
        return pa.StructArray.from_arrays(
            [lists, pa.array(reasons, pa.string()), pa.array(errors, pa.string())],
            names=[_ROWS, _REASON, _ERROR])


class ArrowIpcDecoder(Decoder):
    """``parse`` gives one struct per record; :meth:`rows` its table rows (exploded by
    the batch function, see ``explodes``)."""

    reasons = (NULL_VALUE, MALFORMED_ARROW, SCHEMA_MISMATCH)
    explodes = True

    def __init__(self, schema: T.StructType) -> None:
        super().__init__(schema)
        self.converter = _Converter(schema)

    def parse(self, value: Column) -> Column:
        from pyspark.sql.functions import arrow_udf

        returns = T.StructType([
            T.StructField(_ROWS, T.ArrayType(self.schema)),
            T.StructField(_REASON, T.StringType()), T.StructField(_ERROR, T.StringType())])
        converter = self.converter

        def decode(values: pa.Array) -> pa.Array:
            return converter(values)

        return arrow_udf(decode, returns)(value)

    def rows(self, parsed: Column) -> Column:
        return parsed[_ROWS]

    def failure(self, value: Column, parsed: Column, unknown: Column | None = None) -> Column:
        return F.when(value.isNull(), F.lit(NULL_VALUE)).otherwise(parsed[_REASON])

    def explain(self, value: Column, parsed: Column) -> tuple[Column, Column]:
        detail = F.when(value.isNull(), F.lit("the record has no value (tombstone)")).otherwise(
            F.concat(F.lit("Arrow IPC stream ("), F.length(value).cast("string"),
                     F.lit(" bytes): "), F.coalesce(parsed[_ERROR], F.lit("?"))))
        return self.failure(value, parsed), detail
