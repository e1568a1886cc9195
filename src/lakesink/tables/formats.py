"""Table formats, looked up by name: what differs between Parquet and Delta is decided
here, once, instead of by a comparison of the format's name wherever it matters.

A :class:`TableFormat` opens the format's writer — :func:`open_writer` is the one place
a table writer is built: the data tables, the silence table, a Delta dead-letter table —
and says what the rest of lakesink needs to know of it:

* its **commit protocol**, carried by its writer (``stages_before_commit``): Parquet
  stages the batch's files invisibly, then publishes them under names derived from the
  batch and writes the batch's manifest last (stage-then-commit); a Delta append *is*
  the commit, keyed by ``txnAppId``/``txnVersion`` (write-is-commit).
  :mod:`lakesink.tables.base` states the contract both keep: a batch written twice
  leaves the table as if written once;
* whether the table has a **log** of its files (``has_log``): a Delta table does, and
  readers, catalogs and maintenance ask it (a catalog registers the table once, by its
  log); a Parquet table's folders and lakesink's manifests are the table (readers list
  the folders, so a folder's name must not hide it; a catalog registers its files batch
  by batch through the outbox);
* whether a column's type widens by default (``widens_by_default``): Parquet files each
  carry their types; a Delta table needs its type-widening feature turned on;
* whether two drivers may commit to one table on S3 (``one_driver_on_s3``): a Delta log
  with the single-driver log store loses a commit when two do, so its writers hold a
  whole-table lease there;
* what the table **holds** (``read_contents``: batches, rows, files, bytes), read
  without Spark from its own source of truth: lakesink's manifests for Parquet, the log
  for Delta (:mod:`lakesink.tables.contents`);
* its **maintenance** (``maintainer``: ``compact``, ``vacuum``, ``repair``), named by
  import path (the maintenance package sits above the tables): lakesink's own journal
  for Parquet, Delta's own commands for Delta.

Adding a format is adding a :class:`TableFormat` here and its writer module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lakesink.errors import ConfigError

if TYPE_CHECKING:
    import threading

    import pyarrow.fs as pafs
    from pyspark.sql import SparkSession

    from lakesink.tables.base import TableWriter
    from lakesink.tables.contents import OpenLog, TableContents
    from lakesink.tables.layout import TableLayout


@dataclass(frozen=True)
class WriterOptions:
    """What a table writer is opened with (delta-rs calls the like ``WriterProperties``);
    a format ignores the options it has no use for."""

    #: the checkpoint's app id: keys every commit (Delta txn, Parquet file names)
    app_id: str
    partition_by: Sequence[str] = ()
    compression: str = "snappy"
    #: new files per partition folder per batch (0: as Spark's tasks write them)
    files_per_partition: int = 1
    target_file_size: int | None = None
    null_value: str | None = None
    #: the writer lease: its TTL (0: none) and whether it covers the whole table
    lease_s: float = 0.0
    lease_per_table: bool = False
    #: Delta: a checkpoint every N commits, new columns by mergeSchema, type widening,
    #: and where the Arrow tasks write the files (or why they cannot)
    checkpoint_interval: int | None = None
    merge_schema: bool = True
    type_widening: bool = False
    task_filesystem: tuple[str, dict[str, Any]] | str = "no filesystem for the tasks"
    #: the table's records are expected to take the Arrow path (JSON, no transforms,
    #: an engine other than ``spark``); a schema it cannot read still sends a batch to
    #: Spark's writer
    arrow_records: bool = False
    #: the configuration key a refusal of the table names (Delta: a log that is gone)
    config_key: str = "table.name"

    def common(self) -> dict[str, Any]:
        """The keywords every writer takes (:class:`~lakesink.tables.base.TableWriter`)."""
        return {"app_id": self.app_id, "partition_by": list(self.partition_by),
                "compression": self.compression,
                "files_per_partition": self.files_per_partition,
                "target_file_size": self.target_file_size, "null_value": self.null_value,
                "lease_s": self.lease_s, "lease_per_table": self.lease_per_table}


class TableFormat(ABC):
    """One table format (see the module's docstring)."""

    name: ClassVar[str]
    #: the table has a log of its files (readers and catalogs ask it, not the folders)
    has_log: ClassVar[bool]
    #: partition folders are named in ASCII (:func:`~lakesink.tables.paths.ascii_name`):
    #: delta-rs commits the table's files, and Delta-Spark's ``VACUUM`` would take a
    #: folder named with raw non-ASCII characters for an untracked one
    ascii_folders: ClassVar[bool] = False
    #: schema evolution widens column types unless told not to
    widens_by_default: ClassVar[bool]
    #: one driver may commit to the table on S3 (with the single-driver log store)
    one_driver_on_s3: ClassVar[bool]
    #: ``module:Class`` of its :class:`~lakesink.maintenance.base.Maintainer`
    maintainer: ClassVar[str]

    def maintainer_class(self) -> type[Any]:
        """The format's :class:`~lakesink.maintenance.base.Maintainer` (imported now)."""
        import importlib

        module, _, name = self.maintainer.partition(":")
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]

    def load_classes(self, spark: SparkSession, tables: Sequence[WriterOptions]
                     ) -> threading.Thread | None:
        """At start, before the first table is opened: begin loading the JVM classes the
        writers of ``tables`` (the run's tables of this format, by their options) will
        use, on a thread of its own, beside the checks that come first; returns the
        thread (to be joined before a table is opened: two threads initialising the
        same classes could deadlock), or None (nothing to load, the default)."""
        return None

    @abstractmethod
    def open_writer(self, spark: SparkSession, layout: TableLayout,
                    options: WriterOptions) -> TableWriter:
        """The format's writer of ``layout``'s table (not prepared yet)."""

    @abstractmethod
    def duckdb_scan(self, location: str) -> tuple[str, str]:
        """How DuckDB's Python package, as the set-up installs it, reads the table at
        ``location``: (Python to run first, the SQL that names the table)."""

    @abstractmethod
    def read_contents(self, fs: pafs.FileSystem, meta: str, layout: TableLayout,
                      open_log: OpenLog, app_id: str | None) -> TableContents:
        """What ``layout``'s table holds, read without Spark: ``fs`` and ``meta`` (the
        table's ``.lakesink`` folder as a path of ``fs``) for lakesink's own files,
        ``open_log`` for a log; ``app_id``: the checkpoint's."""


class ParquetFormat(TableFormat):
    name = "parquet"
    has_log = False
    widens_by_default = True
    one_driver_on_s3 = False
    maintainer = "lakesink.maintenance.parquet:ParquetMaintainer"

    def open_writer(self, spark: SparkSession, layout: TableLayout,
                    options: WriterOptions) -> TableWriter:
        from lakesink.tables.parquet import ParquetTableWriter

        return ParquetTableWriter(spark, layout, **options.common())

    def duckdb_scan(self, location: str) -> tuple[str, str]:
        return "", f"read_parquet('{location}/**/*.parquet', hive_partitioning=true)"

    def read_contents(self, fs: pafs.FileSystem, meta: str, layout: TableLayout,
                      open_log: OpenLog, app_id: str | None) -> TableContents:
        from lakesink.tables.contents import from_manifests

        return from_manifests(fs, meta)


class DeltaFormat(TableFormat):
    name = "delta"
    has_log = True
    ascii_folders = True
    widens_by_default = False
    one_driver_on_s3 = True
    maintainer = "lakesink.maintenance.delta:DeltaMaintainer"

    def load_classes(self, spark: SparkSession, tables: Sequence[WriterOptions]
                     ) -> threading.Thread | None:
        """None when delta-rs is expected to make and commit every table (records on
        the Arrow path, a store delta-rs reaches, no type widening): their start loads
        no JVM class of Delta's (a batch Spark's writer takes after all loads them)."""
        from lakesink.tables.delta_create import load_classes

        if all(t.arrow_records and not t.type_widening
               and not isinstance(t.task_filesystem, str) for t in tables):
            return None
        return load_classes(spark)

    def open_writer(self, spark: SparkSession, layout: TableLayout,
                    options: WriterOptions) -> TableWriter:
        from lakesink.tables.delta import DeltaTableWriter

        return DeltaTableWriter(spark, layout, **options.common(),
                                checkpoint_interval=options.checkpoint_interval,
                                merge_schema=options.merge_schema,
                                type_widening=options.type_widening,
                                task_filesystem=options.task_filesystem,
                                arrow_records=options.arrow_records,
                                config_key=options.config_key)

    def duckdb_scan(self, location: str) -> tuple[str, str]:
        # through delta-rs (DuckDB's delta extension is not part of the set-up)
        return (f"import deltalake; t = deltalake.DeltaTable('{location}')"
                ".to_pyarrow_dataset(); ", "t")

    def read_contents(self, fs: pafs.FileSystem, meta: str, layout: TableLayout,
                      open_log: OpenLog, app_id: str | None) -> TableContents:
        from lakesink.tables.contents import from_delta_log

        return from_delta_log(open_log, layout.table, app_id)


#: the formats by name
FORMATS: dict[str, TableFormat] = {f.name: f for f in (ParquetFormat(), DeltaFormat())}


def table_format(name: str, *, key: str = "table.format") -> TableFormat:
    """The format called ``name``; a name no format has is refused, naming ``key``."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigError(key, f"{name!r} is not a table format (one of: "
                          f"{', '.join(FORMATS)})") from None


def open_writer(fmt: str, spark: SparkSession, layout: TableLayout,
                options: WriterOptions) -> TableWriter:
    """A ``fmt`` table writer of ``layout`` — the one place a writer is built."""
    return table_format(fmt).open_writer(spark, layout, options)
