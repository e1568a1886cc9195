"""The table-writer contract: one micro-batch, exactly once.

A :class:`TableWriter` is driven by Spark's ``foreachBatch``. Spark records a batch's
offset range in the checkpoint *before* running it and marks it done only *after* the
batch function returned. So a crash anywhere in :meth:`TableWriter.write_batch` means
the same batch id, with the same rows, runs again on restart. The contract:

* **Idempotent per (app id, batch id).** Writing batch *b* again leaves the table as if
  *b* was written once: a committed *b* is skipped (``BatchResult.skipped``, and no
  Spark job runs for it); an uncommitted *b*'s leftovers are removed and *b* is redone.
  The app id lives inside the checkpoint, so a new checkpoint (batch ids restarting at
  0) never collides with an old one's batches.
* **Nothing is acknowledged before it is durable.** ``write_batch`` returns only after
  the commit point (Parquet: the manifest; Delta: the log entry) is durable. Offsets
  advance only through Spark's checkpoint after that.
* **commit_info** is called once the batch's rows have been computed (so Spark
  observations on ``df`` are filled); what it returns is recorded with the commit where
  the format has a place for it (the Parquet manifest) and returned in ``info``. A
  writer that ``stages_before_commit`` calls it *before* its commit point, and an
  exception from it aborts the batch with nothing published (the next attempt cleans
  the staged files); otherwise it is called after the commit.
* **File size.** With a ``target_file_size``, a partition folder's rows of one batch
  are split into files of at most about that size (Spark's ``maxRecordsPerFile``,
  from the bytes per row the previous batches produced); small batches still make one
  file per folder.
* **prepare** runs once at start, before any data moves, and refuses an existing table
  whose layout differs from the configuration (:class:`~lakesink.errors.LayoutError`).

* **The commit records what the batch wrote.** Rows staged (Parquet: the files'
  footers) or committed (Delta: the commit's ``numOutputRows``) must equal the rows
  ``commit_info`` counted as written; when they differ, ``recount`` (an exact count)
  decides, and a real difference raises :class:`~lakesink.errors.CommitMismatch` —
  before the commit point where the format allows (Parquet), right after it otherwise.
* **Lease.** A writer with a lease checks it right before its commit point
  (:meth:`fence`) and commits nothing once it is lost.

Anything else written per batch (dead letters) is the caller's and must be idempotent
per batch id itself; the batch function stages dead letters before the table's commit
point and publishes them after it (:mod:`lakesink.tables.rejected`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakesink.errors import CommitMismatch, LayoutError
from lakesink.tables.fs import join

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakesink.tables.fs import HadoopFS
    from lakesink.tables.layout import TableLayout

logger = logging.getLogger(__name__)

CommitInfo = Callable[[], dict[str, Any]]
#: an exact count of the rows a batch writes (a Spark job), asked for only when the
#: counts observed during the write disagree with what the write committed
Recount = Callable[[], int]

# Until a batch has been measured: a high guess, so first files err on the small side.
INITIAL_BYTES_PER_ROW = 200.0
MIN_ROWS_PER_FILE = 1000


@dataclass
class BatchResult:
    batch_id: int
    skipped: bool = False
    files: int = 0
    bytes: int = 0
    info: dict[str, Any] = field(default_factory=dict)


class TableWriter(ABC):
    """Writes micro-batches to one table; see the module docstring for the contract."""

    format: str
    #: whether rows are staged invisibly before the commit point (see commit_info)
    stages_before_commit: bool = False

    def __init__(
        self,
        spark: SparkSession,
        layout: TableLayout,
        *,
        app_id: str,
        partition_by: Sequence[str],
        compression: str = "snappy",
        files_per_partition: int = 1,
        target_file_size: int | None = None,
        lease_s: float = 0.0,
        lease_per_table: bool = False,
        null_value: str | None = None,
    ) -> None:
        """``lease_s`` > 0: hold a writer lease with that TTL while writing (see
        :mod:`lakesink.tables.lease`), over the whole table with ``lease_per_table``,
        else over this app id's writes (one process per checkpoint)."""
        from lakesink.tables.fs import HadoopFS
        from lakesink.tables.identity import run_tag
        from lakesink.tables.lease import WriterLease

        self.spark = spark
        self.fs = HadoopFS(spark, layout.base)
        self.layout = layout
        self.app_id = app_id
        self.partition_by = list(partition_by)
        self.compression = compression
        self.files_per_partition = files_per_partition
        self.target_file_size = target_file_size
        #: the NULL folder's value (``table.null_partition_value``), recorded in the layout
        self.null_value = null_value
        # bytes per row in written files; a guess until the first batch measured it
        self.bytes_per_row = INITIAL_BYTES_PER_ROW
        self.lease = (WriterLease(self.fs, layout.lease(None if lease_per_table
                                                       else run_tag(app_id)),
                                  app_id=app_id, ttl_s=lease_s, table=layout.table)
                      if lease_s > 0 else None)

    def rows_per_file(self) -> int | None:
        """The most rows a file of the next batch gets (None: no limit), from the
        target file size and the bytes per row measured so far."""
        if not self.target_file_size:
            return None
        return max(MIN_ROWS_PER_FILE, int(self.target_file_size / self.bytes_per_row))

    def write_options(self, rows_per_file: int | None = None) -> dict[str, str]:
        """Options for the batch's DataFrameWriter (compression, file size);
        ``rows_per_file`` overrides :meth:`rows_per_file` (a redo keeps its first
        attempt's, so it names the same files)."""
        opts = {"compression": self.compression}
        rows = rows_per_file or self.rows_per_file()
        if rows:
            opts["maxRecordsPerFile"] = str(rows)
        return opts

    def measured(self, rows: int, size: int) -> None:
        """Learn the bytes per row from a committed batch (for the next file sizes)."""
        if rows >= MIN_ROWS_PER_FILE and size > 0:
            self.bytes_per_row = size / rows

    def arrow_refusal(self) -> str | None:
        """Why the Arrow data path cannot write this table (None: it can)."""
        return f"the Arrow path writes Parquet and Delta tables; this one is {self.format}"

    @abstractmethod
    def is_committed(self, batch_id: int) -> bool:
        """Whether ``batch_id`` of this app id is already part of the table."""

    def other_writers(self) -> dict[str, int]:
        """The positions other writers recorded in the table while this app id has
        recorded none (a new checkpoint on a table another tool, or a lost checkpoint,
        wrote): Delta's ``txn`` versions by app id. Empty for a format that records
        none (:mod:`lakesink.tables.takeover` decides what a start may do with them)."""
        return {}

    def ensure_table(self, empty: Callable[[], DataFrame], *, at_start: bool = False
                     ) -> None:
        """Before the Arrow path's first batch: make a new table that its tasks' files
        are committed into, with the columns of ``empty()`` (``at_start``: before the
        query starts, and only where no Spark job is needed). A Parquet table is its
        files: nothing to make."""

    def prepare(self) -> None:
        """Check an existing table's layout, or record the layout of a new one; then
        take the writer lease."""
        record_layout(self.fs, self.layout, self.format, self.partition_by,
                      null_value=self.null_value)
        if self.lease is not None:
            self.lease.acquire()

    def fence(self) -> None:
        """Right before a commit point: stop (``LeaseLost``) unless this writer still
        holds its lease (by its clock: renewed within two thirds of the TTL)."""
        if self.lease is not None:
            self.lease.check()

    def prove(self) -> None:
        """Right before a step that deletes, renames or commits on the table's shared
        paths (an earlier attempt's files, the dead-letter outbox, the publish, the
        commit): :meth:`fence`, then the lease's proof at the store
        (:meth:`~lakesink.tables.lease.WriterLease.prove`) that no one took it over."""
        if self.lease is not None:
            self.lease.check()
            self.lease.prove()

    def close(self) -> None:
        """Release what the writer holds (its lease); the writer is done."""
        if self.lease is not None:
            self.lease.release()

    @abstractmethod
    def write_batch(
        self, batch_id: int, df: DataFrame, *, commit_info: CommitInfo | None = None,
        recount: Recount | None = None,
    ) -> BatchResult:
        """Make ``df``'s rows part of the table exactly once for ``batch_id``."""

    def tidy(self, batch_id: int) -> None:  # noqa: B027 - optional hook
        """Remove bookkeeping a committed ``batch_id`` may have left (a crash right
        after its commit point); called when a replay finds it committed."""

    def stage(self, df: DataFrame, folder: str, rows_per_file: int | None) -> None:
        """Spark writes ``df`` as partitioned Parquet into the private ``folder``."""
        writer = (self.shuffled(df).write.mode("overwrite")
                  .options(**self.write_options(rows_per_file)))
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.parquet(folder)

    def listed(self, folder: str) -> list[tuple[str, str, int]]:
        """(path, path below ``folder``, bytes) of the Parquet files staged there."""
        return [(f.path, f.relative, f.size)
                for f in self.fs.list_files(folder, suffix=".parquet")]

    def shuffled(self, df: DataFrame) -> DataFrame:
        """Rows grouped so each partition folder gets ``files_per_partition`` new files
        per batch (0: whatever Spark's tasks produce)."""
        if not self.partition_by or self.files_per_partition == 0:
            return df
        from pyspark.sql import functions as F

        cols = [F.col(c) for c in self.partition_by]
        if self.files_per_partition == 1:
            return df.repartition(*cols)
        salt = F.pmod(F.xxhash64(*df.columns), F.lit(self.files_per_partition))
        return df.repartition(*cols, salt)


def compare_layout(existing: dict[str, Any], fmt: str, partition_by: Sequence[str], *,
                   table: str, null_value: str | None = None) -> None:
    """Raise LayoutError when a recorded table layout differs from the configuration."""
    if existing.get("format") != fmt:
        raise LayoutError(
            "table.format", f"table {table} is {existing.get('format')}, config says {fmt}",
            fix="use the table's format, or write to a new table",
        )
    if list(existing.get("partition_by", [])) != list(partition_by):
        raise LayoutError(
            "table.partition_by",
            f"table {table} is partitioned by {existing.get('partition_by')}, "
            f"config says {list(partition_by)}",
            fix="use the table's partition columns, or write to a new table",
        )
    recorded = existing.get("null_partition_value")
    if partition_by and null_value is not None and recorded is not None \
            and recorded != null_value:
        raise LayoutError(
            "table.null_partition_value",
            f"table {table} keeps NULL partition values in folders named {recorded!r}, "
            f"config says {null_value!r}: NULLs would land in two folders, and readers "
            "would take one of them for a value",
            fix="use the table's null_partition_value, or write to a new table",
        )


#: beside ``layout.json``: the NULL folder's value of a table recorded without one
NULL_RECORD = "null_partition_value.json"


def recorded_layout(fs: HadoopFS, layout: TableLayout) -> dict[str, Any] | None:
    """The table's recorded layout (None: a new table): ``layout.json``, with the NULL
    folder's value from :data:`NULL_RECORD` when ``layout.json`` predates it."""
    existing = fs.read_json(layout.layout_file)
    if not isinstance(existing, dict) or "null_partition_value" in existing:
        return existing  # type: ignore[no-any-return]
    side = fs.read_json(join(layout.meta, NULL_RECORD))
    if isinstance(side, dict) and "null_partition_value" in side:
        return {**existing, "null_partition_value": side["null_partition_value"]}
    return existing


def check_layout(fs: HadoopFS, layout: TableLayout, fmt: str,
                 partition_by: Sequence[str], *,
                 null_value: str | None = None) -> dict[str, Any] | None:
    """Refuse an existing table whose recorded format, partition columns or NULL folder
    value differ. Returns the recorded layout (None: a new table). Runs before any data
    moves."""
    existing = recorded_layout(fs, layout)
    if existing is not None:
        compare_layout(existing, fmt, partition_by, table=layout.table,
                       null_value=null_value)
    return existing


def record_layout(fs: HadoopFS, layout: TableLayout, fmt: str,
                  partition_by: Sequence[str], *, null_value: str | None = None) -> None:
    """:func:`check_layout`, then record what is not recorded yet: a new table's layout,
    or the NULL folder's value of a table recorded before lakesink kept it. Each record
    is a create-if-absent, so of two first starts (of any checkpoints: each holds its
    own lease) exactly one records, and the other is compared with it — an overwrite
    let the second start's NULL folder value replace the first's while the first wrote
    (known-open L13: NULLs in two folders)."""
    existing = check_layout(fs, layout, fmt, partition_by, null_value=null_value)
    keeps_nulls = bool(partition_by) and null_value is not None
    if existing is None:
        fs.mkdirs(layout.table)
        record: dict[str, Any] = {
            "format": fmt, "partition_by": list(partition_by),
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        if keeps_nulls:
            record["null_partition_value"] = null_value
        created = fs.write_once(layout.layout_file,
                                json.dumps(record, indent=1, sort_keys=True))
    elif keeps_nulls and "null_partition_value" not in existing:
        created = fs.write_once(join(layout.meta, NULL_RECORD), json.dumps(
            {"null_partition_value": null_value,
             "recorded": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}))
    else:
        return
    if not created:  # another start recorded it first: it holds
        check_layout(fs, layout, fmt, partition_by, null_value=null_value)


@dataclass(frozen=True)
class StagedFile:
    staged: str  #: where Spark wrote it
    name: str  #: its path below the table folder once published
    bytes: int
    rows: int  #: from its footer


def check_rows(batch_id: int, table: str, files: list[StagedFile], info: dict[str, Any],
               recount: Recount | None = None) -> None:
    """The commit invariant: the rows about to be committed are exactly the rows the
    batch counted as written. When the observed count disagrees, ``recount`` (an exact
    count) decides — an observation can count a re-run task twice — and ``info`` is
    corrected; a real difference raises :class:`CommitMismatch` before the commit point
    (nothing is published; the query stops, loudly)."""
    if "written" not in info:
        return
    staged = sum(f.rows for f in files)
    if staged != int(info["written"]) and recount is not None:
        exact = recount()
        if exact == staged:
            logger.warning("batch %d: the observed count (%d written) was off; an exact "
                           "count agrees with the %d staged row(s)", batch_id,
                           int(info["written"]), staged)
            info["written"] = exact
            info["records"] = exact + int(info.get("rejected", 0))
    if staged != int(info["written"]):
        raise CommitMismatch(
            f"batch {batch_id} of {table}: {int(info['written'])} row(s) counted as written "
            f"but {staged} found in {len(files)} staged file(s); nothing was committed. "
            "This is a lakesink bug: please report it with this message")
