"""Output columns of a table: payload fields plus derived partition columns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import types as T

from lakesink.errors import ConfigError
from lakesink.pipeline.partitioning import (
    TIME_PARTS,
    check_timestamp_type,
    folder_unfit_expr,
    time_part_exprs,
    timestamp_column_expr,
)
from lakesink.tables.paths import HIVE_DEFAULT_PARTITION, MAX_FOLDER_BYTES, folder_fits

if TYPE_CHECKING:
    from pyspark.sql import Column


@dataclass(frozen=True)
class PartitionSpec:
    """Which partition columns come from the payload and which from the timestamp."""

    columns: tuple[str, ...]
    timestamp_column: str | None
    timestamp_type: T.DataType | None
    use_kafka_timestamp: bool
    null_value: str
    #: folders named in ASCII (a Delta table's: see ``TableFormat.ascii_folders``), which
    #: the length a value may have counts with
    ascii_folders: bool = False

    @property
    def derived(self) -> tuple[str, ...]:
        if self.timestamp_column is None:
            return ()
        return tuple(c for c in self.columns if c in TIME_PARTS)

    @classmethod
    def build(
        cls, *, columns: Sequence[str], schema: T.StructType, timestamp_column: str | None,
        timestamp_fallback: str = "none", null_value: str = HIVE_DEFAULT_PARTITION,
        ascii_folders: bool = False,
    ) -> PartitionSpec:
        fields = {f.name: f.dataType for f in schema.fields}
        ts_type = None
        if timestamp_column is not None:
            if timestamp_column not in fields:
                raise ConfigError(
                    "table.timestamp_column",
                    f"{timestamp_column!r} is not a field of the schema ({', '.join(fields)})",
                )
            ts_type = fields[timestamp_column]
            try:
                check_timestamp_type(ts_type)
            except TypeError as exc:
                raise ConfigError("table.timestamp_column", str(exc)) from None
        for col in columns:
            derived = timestamp_column is not None and col in TIME_PARTS
            if not derived and col not in fields:
                hint = (" (year/month/day/hour need table.timestamp_column)"
                        if col in TIME_PARTS else "")
                raise ConfigError(
                    "table.partition_by",
                    f"{col!r} is neither a field of the schema nor derived{hint}",
                )
            if not derived and isinstance(fields[col], (T.StructType, T.ArrayType, T.MapType,
                                                        T.BinaryType)):
                raise ConfigError("table.partition_by",
                                  f"{col!r} is a {fields[col].simpleString()}: not partitionable")
        for col in columns:
            if not folder_fits(col, null_value, ascii_only=ascii_folders):
                raise ConfigError(
                    "table.null_partition_value",
                    f"{null_value[:40]!r}… cannot name a folder of {col!r} (a NUL byte, or "
                    f"{col}=<value>, escaped, over {MAX_FOLDER_BYTES} bytes)")
        return cls(tuple(columns), timestamp_column, ts_type,
                   timestamp_fallback == "kafka", null_value, ascii_folders)

    def timestamp(self, record: Column, kafka_timestamp: Column) -> tuple[Column, Column]:
        """(UTC timestamp, invalid flag) for each record."""
        from pyspark.sql import functions as F

        assert self.timestamp_column is not None and self.timestamp_type is not None
        raw = record[self.timestamp_column]
        ts = timestamp_column_expr(raw, self.timestamp_type)
        invalid = raw.isNotNull() & ts.isNull()
        if self.use_kafka_timestamp:
            ts = F.when(raw.isNull(), kafka_timestamp).otherwise(ts)
        return ts, invalid

    def _null_folder(self, col: Column) -> Column:
        """Null and empty values -> the configured null folder value.

        Spark already maps both to ``__HIVE_DEFAULT_PARTITION__``; only another value
        needs an expression (as :func:`partition_path` does).
        """
        from pyspark.sql import functions as F

        if self.null_value == HIVE_DEFAULT_PARTITION:
            return col
        text = col.cast("string")
        return F.when(text.isNull() | (text == ""), F.lit(self.null_value)).otherwise(text)

    def unfit_folders(self, record: Column, schema: T.StructType
                      ) -> tuple[Column, Column] | None:
        """(unfit, detail) per record: whether one of its text partition values cannot
        name a folder (:func:`~lakesink.tables.paths.folder_fits`), and which;
        ``None`` when the table has no text partition column."""
        from pyspark.sql import functions as F

        names = [f.name for f in schema.fields if f.name in self.columns
                 and f.name not in self.derived and isinstance(f.dataType, T.StringType)]
        if not names:
            return None
        unfit = {name: folder_unfit_expr(name, record[name], ascii_only=self.ascii_folders)
                 for name in names}
        details = [F.when(check, F.lit(
            f"{name}: the value cannot name a partition folder (it holds a NUL byte, or "
            f"{name}=<value>, escaped, is over {MAX_FOLDER_BYTES} bytes)"))
            for name, check in unfit.items()]
        if self.null_value != HIVE_DEFAULT_PARTITION:
            # the folder every reader (and the Hive metastore) takes for NULL, while this
            # table's NULL folder is another: the value would come back as NULL
            for name in names:
                reserved = F.coalesce(record[name] == F.lit(HIVE_DEFAULT_PARTITION),
                                      F.lit(False))
                unfit[f"{name}\x00reserved"] = reserved
                details.append(F.when(reserved, F.lit(
                    f"{name}: the value is {HIVE_DEFAULT_PARTITION}, which readers take for "
                    f"NULL (this table's NULL folder is {self.null_value!r})")))
        any_unfit = F.lit(False)
        for check in unfit.values():
            any_unfit = any_unfit | check
        return any_unfit, F.coalesce(*details)

    def output_columns(
        self, record: Column, schema: T.StructType, ts: Column | None
    ) -> list[Column]:
        """Payload columns followed by derived partition columns.

        ``ts`` is the record's UTC timestamp (from :meth:`timestamp`), computed once by
        the caller; it is required when there are derived columns.
        """
        derived = self.derived
        out: list[Column] = []
        for f in schema.fields:
            if f.name in derived:
                continue  # the derived value wins over a payload field of the same name
            col = record[f.name]
            if f.name in self.columns:
                col = self._null_folder(col)
            out.append(col.alias(f.name))
        if derived:
            assert ts is not None
            parts = time_part_exprs(ts)
            out.extend(self._null_folder(parts[name]).alias(name) for name in derived)
        return out



@dataclass(frozen=True)
class SourceColumns:
    """Columns filled from the Kafka record: its key, and a metadata struct."""

    key_column: str | None = None
    key_format: str = "string"
    metadata_column: str | None = None

    @property
    def names(self) -> list[str]:
        return [c for c in (self.key_column, self.metadata_column) if c]

    def check(self, schema: T.StructType) -> None:
        """A payload field may not share a name with a key/metadata column."""
        taken = {n.lower() for n in schema.fieldNames()}
        for col, key in ((self.key_column, "table.key_column"),
                         (self.metadata_column, "table.metadata_column")):
            if col and col.lower() in taken:
                raise ConfigError(key, f"{col!r} is also a field of the schema; pick another "
                                       "name")

    def columns(self) -> list[Column]:
        """Expressions over the batch's raw columns (``key``, ``topic``, ``partition``,
        ``offset``, ``kafka_timestamp``, ``timestampType``)."""
        from pyspark.sql import functions as F

        out = []
        if self.key_column:
            key = F.col("key")
            if self.key_format == "string":
                key = F.make_valid_utf8(key.cast("string"))
            out.append(key.alias(self.key_column))
        if self.metadata_column:
            out.append(F.struct(
                F.col("topic"), F.col("partition"), F.col("offset"),
                F.col("kafka_timestamp").alias("timestamp"),
                F.col("timestampType").alias("timestamp_type"),
            ).alias(self.metadata_column))
        return out
