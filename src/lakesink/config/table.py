"""The ``table`` section (a table's layout, format, files, schema policy, columns, transforms), and the ``dlq`` and ``maintenance`` sections that act on tables."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import (
    ByteSize,
    Field,
    field_validator,
    model_validator,
)

from lakesink.config.base import NAME, Compression, Section, StrList, split_list
from lakesink.config.transform_text import parse_transforms
from lakesink.errors import ConfigError
from lakesink.tables.formats import table_format


class TableConfig(Section):
    name: str | None = Field(default=None, description="table folder name; default: the topic")
    base_path: str = "./lake"
    format: Literal["parquet", "delta"] = "parquet"
    partition_by: StrList = Field(default_factory=list)
    timestamp_column: str | None = None
    timestamp_fallback: Literal["none", "kafka"] = Field(
        default="none",
        description="when the timestamp is null: 'kafka' uses the record's Kafka timestamp",
    )
    compression: Compression = "snappy"
    engine: Literal["auto", "arrow", "spark"] = Field(
        default="auto",
        description="the per-row work: 'arrow' decodes and writes in pyarrow inside "
        "Spark's tasks (Parquet tables of JSON records on local disk, flat schemas; "
        "refused at start otherwise), 'spark' in Spark's row expressions, 'auto' arrow "
        "where it can (see docs/architecture.md, 'The Arrow data path')",
    )
    null_partition_value: str = "__HIVE_DEFAULT_PARTITION__"
    delta_checkpoint_interval: int | None = Field(
        default=None, gt=0,
        description="Delta: write a log checkpoint every N commits (set when the table is "
        "created; 10, delta-spark's default, otherwise)",
    )
    files_per_partition: int = Field(
        default=1, ge=0,
        description="new files per partition folder per batch (0 = one per Spark task)",
    )
    target_file_size: ByteSize | None = Field(
        default=ByteSize(128 * 1024 * 1024),
        description="split a partition folder's rows of one batch into files of about "
        "this size (e.g. '128MiB'); null = no limit",
    )
    schema_evolution: Literal["add_columns", "strict"] = Field(
        default="add_columns",
        description="add_columns: new top-level fields become new nullable columns; "
        "strict: the schema never changes",
    )
    max_columns: int = Field(
        default=1000, ge=1,
        description="add_columns: the most fields schema evolution may grow the table "
        "to; a record whose new fields would pass it is a dead letter (too_many_fields)",
    )
    unknown_fields: Literal["drop", "reject"] = Field(
        default="drop",
        description="strict only: drop fields outside the schema (counted, logged) or "
        "reject the record (reason unknown_field)",
    )
    type_widening: bool | None = Field(
        default=None,
        description="let a column widen (int -> bigint, float -> double) when a value "
        "needs it; default: on for parquet with add_columns, off for delta (delta-rs "
        "cannot read Delta's typeWidening feature) and for strict",
    )

    key_column: str | None = Field(
        default=None,
        description="add the record's Kafka key as this column (the Quix sink's '__key')",
    )
    key_format: Literal["string", "bytes"] = Field(
        default="string",
        description="key_column type: string (UTF-8; invalid sequences become U+FFFD) or "
        "bytes (binary, exact)",
    )
    metadata_column: str | None = Field(
        default=None,
        description="add a struct column with the record's topic, partition, offset, "
        "timestamp and timestamp_type (like the Danube sink's include_*_metadata)",
    )

    writer_lease_s: float = Field(
        default=60.0, ge=0, description="TTL of the writer lease every table writer holds "
        "(one process per checkpoint; for Delta on S3 with the single-driver log store "
        "and on Azure, one writer per table): a second writer is refused, a holder gone for this long "
        "is taken over (0: off)")
    other_writers: Literal["refuse", "ignore"] = Field(
        default="refuse", description="a new checkpoint on a Delta table that holds "
        "another writer's txn (kafka-delta-ingest's <app_id>-<partition>, or a lost "
        "checkpoint's): refuse unless source.kafka.starting_offsets says where to start "
        "(JSON offsets after the table's, latest, group); ignore: start anyway (rows "
        "already in the table may come again)")
    transforms: list[str] = Field(
        default_factory=list,
        description="ordered 'name: expression' list; Spark SQL over the record's fields "
        "and kafka.{key,topic,partition,offset,timestamp,timestamp_type,headers}; "
        "kafka-delta-ingest strings are translated",
    )

    _split = field_validator("partition_by", mode="before")(split_list)

    @field_validator("transforms")
    @classmethod
    def _transforms(cls, value: list[str]) -> list[str]:
        try:
            parse_transforms(value)
        except ConfigError as exc:
            raise ValueError(f"{exc.key}: {exc.message}") from None
        return value

    @field_validator("key_column", "metadata_column")
    @classmethod
    def _column_name(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value):
            raise ValueError(f"{value!r} is not a plain column name")
        return value

    @property
    def source_columns(self) -> list[str]:
        """Columns filled from the Kafka record rather than the payload."""
        return [c for c in (self.key_column, self.metadata_column) if c]

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not NAME.match(value):
            raise ValueError("use letters, digits, '_', '-' and '.', starting with a letter/digit")
        return value

    @field_validator("partition_by")
    @classmethod
    def _partitions(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("a column appears twice")
        for col in value:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", col):
                raise ValueError(f"{col!r} is not a plain column name")
        return value

    @field_validator("null_partition_value")
    @classmethod
    def _null_value(cls, value: str) -> str:
        if not value or "/" in value or "=" in value or value in (".", ".."):
            raise ValueError("must be a non-empty folder-safe value (no '/', '=', '.', '..')")
        return value

    @model_validator(mode="after")
    def _time_partitions(self) -> TableConfig:
        if self.timestamp_column is None and self.timestamp_fallback == "kafka":
            raise ValueError("timestamp_fallback=kafka needs timestamp_column")
        if ("unknown_fields" in self.model_fields_set and self.unknown_fields == "reject"
                and self.schema_evolution != "strict"):
            raise ValueError("table.unknown_fields: 'reject' needs schema_evolution=strict "
                             "(add_columns turns unknown fields into columns)")
        if self.key_column and self.key_column == self.metadata_column:
            raise ValueError("table.metadata_column: the same name as table.key_column")
        if not table_format(self.format).has_log:  # readers list its folders
            for col in self.partition_by:
                if col.startswith("_"):
                    raise ValueError(
                        f"table.partition_by: {col!r} starts with '_': its folders "
                        f"({col}=…) are hidden from Hadoop, Hive, Trino and pyarrow, which "
                        "skip names starting with '_' or '.'; partition by a column without "
                        f"the '_' (e.g. the transform '{col.lstrip('_') or 'part'}: {col}'), "
                        "or use format delta, whose log lists the files")
        for col in self.source_columns:
            if col in self.partition_by:
                raise ValueError(f"table.partition_by: {col!r} is a key/metadata column; "
                                 "partition by payload fields or time parts")
        if self.target_file_size is not None and self.target_file_size < 1024 * 1024:
            raise ValueError("table.target_file_size: must be at least 1MiB")
        return self

    @property
    def widening(self) -> bool:
        """Whether columns may widen (the format-dependent default resolved)."""
        if self.type_widening is None:
            return (table_format(self.format).widens_by_default
                    and self.schema_evolution == "add_columns")
        return self.type_widening


class DlqConfig(Section):
    format: Literal["parquet", "delta"] = Field(
        default="parquet",
        description="dead-letter tables (<base>/_rejected/<table>): parquet (a file per "
        "batch) or delta (a Delta table, committed once per batch)")
    retention_days: float | None = Field(
        default=None, gt=0, description="`lakesink vacuum` deletes dead letters older than "
        "this (none: keep them); those an unfinished `dlq replay` holds stay")


class MaintenanceConfig(Section):
    """``maintenance``: ``lakesink compact``, ``vacuum`` and ``repair``
    (``docs/maintenance.md``)."""

    min_age_s: float = Field(
        default=3600, ge=0, description="compact a Parquet partition folder only when its "
        "newest file is at least this old (so compaction does not fight the live stream)")
    small_file_size: ByteSize | None = Field(
        default=None, description="Parquet files below this size are merged; default half "
        "of table.target_file_size (64MiB without one)")
    replaced_grace_s: float = Field(
        default=86400, ge=0, description="Parquet: files a compaction replaced are kept "
        "(outside the table) this long before `lakesink vacuum` deletes them")
    resume_every_s: float = Field(
        default=60, ge=0, description="Parquet: a running `lakesink run` finishes (or "
        "undoes) a compaction a killed compactor left, at start and then at most this "
        "often after a batch (0: only `compact`, `vacuum` and `repair --apply` do)")
    vacuum_retention_hours: float = Field(
        default=168, ge=0, description="Delta VACUUM retention; less than 168 hours is "
        "refused unless `lakesink vacuum --force`")
    zorder_by: list[str] = Field(
        default_factory=list, description="Delta OPTIMIZE: Z-order by these columns")
