"""Hive-partitioned Parquet tables, exactly once for readers that list files.

One batch ``b`` of run ``r`` (the checkpoint's app id) goes through:

1. **skip** if ``manifests/r/b.json`` exists and names this app id (the batch was
   committed before a crash); its leftover bookkeeping is removed (:meth:`tidy`, also
   called by the batch function when it skips the batch itself);
2. **begin**: leftovers of an earlier attempt are removed (the files its
   ``pending/r/b.json`` lists, the staging folder) and the attempt is recorded there
   with the rows per file it uses — the first attempt's, so a redo names the same files;
3. **stage**: Spark writes the batch partitioned into ``staging/r/b/`` (outside the
   table folder, so no reader sees it);
4. **check**: the staged files' rows (from their footers) must equal the rows the batch
   counted as written, or nothing is committed (:func:`check_rows`);
5. **pending**: the list of final names is written, so a crash while publishing can be
   cleaned exactly;
6. **publish**: each staged file is renamed to
   ``<table>/<c1=v1/…>/part-<b>-<r>-<n>.parquet`` (``n`` counts the batch's files in
   that folder); a rename is atomic, so a reader never sees a partial file, and the
   names derive from the batch, so a redo replaces rather than adds;
7. **manifest** ``manifests/r/b.json`` (every file with its rows and bytes) is written
   last, and only if it does not exist (a conditional PUT on S3, ``create`` without
   overwrite elsewhere): the commit point. Finding it already there means a second
   writer on the same checkpoint, which is refused.

Readers that list files see a batch's files appear one by one during step 6 (and, for
a redo after a crash there, disappear and reappear); the manifests are the committed
truth. See ``docs/architecture.md`` ("What a reader sees").

Nothing depends on Spark's ``_spark_metadata``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import TYPE_CHECKING, Any

from lakesink.errors import CommitMismatch, SecondWriterError, SinkError
from lakesink.faults import fault_point
from lakesink.tables.base import (
    BatchResult,
    CommitInfo,
    Recount,
    StagedFile,
    TableWriter,
    check_rows,
)
from lakesink.tables.fs import join
from lakesink.tables.identity import run_tag
from lakesink.tables.layout import TableLayout
from lakesink.tables.manifests import read_manifest
from lakesink.tables.paths import is_safe_relative_dir

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)

# a file this big has seen enough values for Parquet's dictionary verdict to mean something
LEARN_FROM_BYTES = 128 * 1024
# Hadoop options of the staging write (a DataFrameWriter option goes into the job's conf)
STAGING_COMMITTER = {"mapreduce.fileoutputcommitter.marksuccessfuljobs": "false"}
# after a verdict, footers are read again only every this many batches (one footer read
# is a couple of small GETs on an object store)
RELEARN_EVERY = 100


class ParquetTableWriter(TableWriter):
    format = "parquet"
    stages_before_commit = True

    def __init__(self, spark: SparkSession, layout: TableLayout, **kwargs: Any) -> None:
        super().__init__(spark, layout, **kwargs)
        self.run = run_tag(self.app_id)
        # columns whose dictionary encoding Parquet abandoned in an earlier batch
        self.no_dictionary: set[str] = set()
        self._verdict_at: int | None = None  # the batch whose footer gave the last verdict

    def write_options(self, rows_per_file: int | None = None) -> dict[str, str]:
        """Spark's options plus, for columns Parquet gave up dictionary-encoding in an
        earlier batch of this run (too many distinct values), no dictionary attempt: the
        attempt (hashing every value until the dictionary overflows) is wasted work."""
        opts = super().write_options(rows_per_file)
        # the staging folder is private and published by this writer: no _SUCCESS marker
        # (Hadoop's committer algorithm stays 1: its job commit takes only the committed
        # task attempts, which keeps a re-run task's leftovers out of the staged files)
        opts.update(STAGING_COMMITTER)
        for column in sorted(self.no_dictionary):
            opts[f"parquet.enable.dictionary#{column}"] = "false"
        return opts

    def _learn_dictionaries(self, batch_id: int, moves: list[tuple[str, str, int]]) -> None:
        """Read the footer of the batch's largest file: a column without a dictionary
        page there had its dictionary abandoned. Until the first verdict (a footer of a
        file big enough) every batch is read, then every ``RELEARN_EVERY`` batches.
        Never fails the batch."""
        if not moves or (self._verdict_at is not None
                         and batch_id - self._verdict_at < RELEARN_EVERY):
            return
        _, rel, size = max(moves, key=lambda m: m[2])
        if size < LEARN_FROM_BYTES:
            return
        try:
            kept = self.fs.parquet_dictionary_columns(join(self.layout.table, rel))
        except Exception as exc:  # noqa: BLE001 - an optimization only
            logger.debug("could not read the footer of %s: %s", rel, exc)
            return
        self._verdict_at = batch_id
        dropped = {c for c, has in kept.items() if not has} - self.no_dictionary
        if dropped:
            logger.info("Parquet dictionary encoding off for high-cardinality column(s): %s",
                        ", ".join(sorted(dropped)))
            self.no_dictionary |= dropped

    def arrow_refusal(self) -> str | None:
        return None

    # -- one batch -----------------------------------------------------------------------

    def is_committed(self, batch_id: int) -> bool:
        """Whether this app id's manifest of ``batch_id`` exists (the app id inside it is
        checked: the run tag in the path is only its first 8 characters)."""
        try:
            manifest = read_manifest(self.fs, self.layout, self.run, batch_id)
        except ValueError:
            # an empty manifest (a kill mid-write, before manifests were written all or
            # nothing): it is created only after every file is published, so the
            # batch is in the table
            logger.warning("batch %d: its manifest is unreadable; the batch counts as "
                           "committed (its files were published before it)", batch_id)
            return True
        if manifest is None:
            return False
        if manifest.get("app_id") != self.app_id:
            raise CommitMismatch(
                f"{self.layout.manifest(self.run, batch_id)} belongs to app id "
                f"{manifest.get('app_id')}, not to this checkpoint's {self.app_id}: two "
                "checkpoints share a run tag; give this table a new checkpoint folder")
        return True

    def tidy(self, batch_id: int) -> None:
        """Remove a committed batch's bookkeeping (a crash after the manifest may have
        left it): its pending record and staging folder."""
        self.fs.delete(self.layout.pending(self.run, batch_id), recursive=False)
        self.fs.delete(self.layout.staging(self.run, batch_id))

    def begin(self, batch_id: int) -> int | None:
        """Start an attempt at an uncommitted batch: remove what an earlier attempt left
        (the files its pending record lists, its staging folder) and record this
        attempt. Returns the rows per file to use: the first attempt's, so a redo
        splits each folder into as many files and so names the same files (which rows
        land in which file of a folder may differ; correctness rests on removing what
        the pending record lists)."""
        pending_path = self.layout.pending(self.run, batch_id)
        self.prove()  # the files below may be a new holder's: never delete them for it
        pending = self.fs.read_json(pending_path) or {}
        if pending.get("files"):
            removed = sum(self.fs.delete(p, recursive=False) for p in pending["files"])
            logger.warning("batch %d: removed %d file(s) of an unfinished attempt", batch_id,
                           removed)
        self.fs.delete(self.layout.staging(self.run, batch_id))
        rows_per_file = pending.get("rows_per_file") or self.rows_per_file()
        self.fs.write_json(pending_path, {"batch_id": batch_id, "app_id": self.app_id,
                                          "rows_per_file": rows_per_file, "files": []})
        return rows_per_file

    def skip_committed(self, batch_id: int) -> bool:
        """True (and its bookkeeping tidied) when ``batch_id`` is already committed."""
        if not self.is_committed(batch_id):
            return False
        logger.info("batch %d already committed: skipped", batch_id)
        self.tidy(batch_id)
        return True

    def named(self, batch_id: int, staged: list[tuple[str, str, int]]) -> list[StagedFile]:
        """The staged files with their names in the table and their rows (from the
        footers). Names derive from the batch, the partition folder and the file's
        place in that folder: ``<folder>/part-<batch>-<run>-<n>.parquet``."""
        out: list[StagedFile] = []
        per_folder: dict[str, int] = {}
        for path, relative, size in staged:
            rel_dir = relative.rpartition("/")[0]
            if not is_safe_relative_dir(rel_dir, self.partition_by):
                raise SinkError(
                    f"unexpected staged path {relative!r} for partitions {self.partition_by}"
                )
            n = per_folder.get(rel_dir, 0)
            per_folder[rel_dir] = n + 1
            name = f"part-{batch_id:010d}-{self.run}-{n:05d}.parquet"
            out.append(StagedFile(path, f"{rel_dir}/{name}" if rel_dir else name, size,
                                  self.fs.parquet_rows(path)))
        return out

    def write_batch(
        self,
        batch_id: int,
        df: DataFrame,
        *,
        commit_info: CommitInfo | None = None,
        recount: Recount | None = None,
    ) -> BatchResult:
        if self.skip_committed(batch_id):
            return BatchResult(batch_id, skipped=True)
        rows_per_file = self.begin(batch_id)
        staging = self.layout.staging(self.run, batch_id)
        self.stage(df, staging, rows_per_file)
        fault_point("after_staging", batch_id)
        info = commit_info() if commit_info else {}
        files = self.named(batch_id, self.listed(staging))
        return self.commit_staged(batch_id, files, info, rows_per_file, recount)

    def commit_staged(self, batch_id: int, files: list[StagedFile], info: dict[str, Any],
                      rows_per_file: int | None, recount: Recount | None = None
                      ) -> BatchResult:
        """Steps 4-7: check the staged rows, record the final names, publish, and write
        the manifest (the commit point)."""
        check_rows(batch_id, self.layout.table, files, info, recount)

        pending_path = self.layout.pending(self.run, batch_id)
        self.fs.write_json(pending_path, {
            "batch_id": batch_id, "app_id": self.app_id, "rows_per_file": rows_per_file,
            "files": [join(self.layout.table, f.name) for f in files],
        })
        self.prove()
        for i, f in enumerate(files):
            self.fence()  # a writer that lost its lease stops before its next rename
            if i == len(files) // 2 and i > 0:
                fault_point("mid_publish", batch_id)
            # a file already there is an earlier attempt's of this batch (the same rows
            # under the same name: replaced) — unless another writer took the table over
            # meanwhile: the lease is proven at the store right before the delete
            self.fs.replace(f.staged, join(self.layout.table, f.name),
                            before_delete=self.prove)
        fault_point("after_publish", batch_id)

        manifest = {
            "batch_id": batch_id,
            "app_id": self.app_id,
            "files": [{"path": f.name, "bytes": f.bytes, "rows": f.rows} for f in files],
            "rows": sum(f.rows for f in files),
            "committed_at": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            **info,
        }
        path = self.layout.manifest(self.run, batch_id)
        self.prove()
        if not self.fs.write_once(path, json.dumps(manifest, indent=1, sort_keys=True)):
            raise SecondWriterError(
                f"batch {batch_id} of app {self.app_id} was committed by another writer while "
                f"this one published it ({path}): two lakesink processes share this "
                "checkpoint. Stop one of them; each table needs exactly one writer.")
        fault_point("after_manifest", batch_id)
        self.tidy(batch_id)
        size = sum(f.bytes for f in files)
        self.measured(int(info.get("written", 0)), size)
        self._learn_dictionaries(batch_id, [(f.staged, f.name, f.bytes) for f in files])
        return BatchResult(batch_id, files=len(files), bytes=size, info=info)
