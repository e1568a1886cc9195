"""Hive-partitioned Parquet tables, exactly once for readers that list files.

One batch ``b`` of run ``r`` (the checkpoint's app id) goes through:

1. **skip** if ``manifests/r/b.json`` exists (the batch was committed before a crash);
2. **clean** leftovers of an earlier attempt: the files listed in ``pending/r/b.json``
   and the staging folder;
3. **stage**: Spark writes the batch partitioned into ``staging/r/b/`` (outside the
   table folder, so no reader sees it);
4. **pending**: the list of final names is written, so a crash while publishing can be
   cleaned exactly;
5. **publish**: each staged file is renamed to
   ``<table>/<c1=v1/…>/part-<b>-<r>-<n>.parquet``; a rename is atomic, so a reader never
   sees a partial file, and the names are derived from the batch, so a redo replaces
   rather than adds;
6. **manifest** ``manifests/r/b.json`` is written last, and only if it does not exist
   (a conditional PUT on S3, ``create`` without overwrite elsewhere): the commit point.
   Finding it already there means a second writer on the same checkpoint, which is
   refused.

Nothing depends on Spark's ``_spark_metadata``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import TYPE_CHECKING, Any

from lakesink.errors import SinkError
from lakesink.faults import fault_point
from lakesink.pipeline.partitioning import is_safe_relative_dir
from lakesink.tables.base import BatchResult, CommitInfo, TableWriter
from lakesink.tables.fs import join
from lakesink.tables.identity import run_tag
from lakesink.tables.layout import TableLayout

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

    def write_options(self) -> dict[str, str]:
        """Spark's options plus, for columns Parquet gave up dictionary-encoding in an
        earlier batch of this run (too many distinct values), no dictionary attempt: the
        attempt (hashing every value until the dictionary overflows) is wasted work."""
        opts = super().write_options()
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

    # -- one batch -----------------------------------------------------------------------

    def is_committed(self, batch_id: int) -> bool:
        return self.fs.exists(self.layout.manifest(self.run, batch_id))

    def _clean(self, batch_id: int) -> None:
        pending_path = self.layout.pending(self.run, batch_id)
        pending = self.fs.read_json(pending_path)
        if pending:
            removed = sum(self.fs.delete(p, recursive=False) for p in pending["files"])
            logger.warning("batch %d: removed %d file(s) of an unfinished attempt", batch_id,
                           removed)
            self.fs.delete(pending_path, recursive=False)
        self.fs.delete(self.layout.staging(self.run, batch_id))

    def write_batch(
        self,
        batch_id: int,
        df: DataFrame,
        *,
        commit_info: CommitInfo | None = None,
    ) -> BatchResult:
        if self.is_committed(batch_id):
            logger.info("batch %d already committed: skipped", batch_id)
            self.fs.delete(self.layout.staging(self.run, batch_id))
            return BatchResult(batch_id, skipped=True)
        self._clean(batch_id)

        staging = self.layout.staging(self.run, batch_id)
        writer = self.shuffled(df).write.mode("overwrite").options(**self.write_options())
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.parquet(staging)
        fault_point("after_staging", batch_id)

        info = commit_info() if commit_info else {}

        # (staged path, path in the table, bytes); names derive from the batch only
        moves: list[tuple[str, str, int]] = []
        for n, f in enumerate(self.fs.list_files(staging, suffix=".parquet")):
            rel_dir = f.relative.rpartition("/")[0]
            if not is_safe_relative_dir(rel_dir, self.partition_by):
                raise SinkError(
                    f"unexpected staged path {f.relative!r} for partitions {self.partition_by}"
                )
            name = f"part-{batch_id:010d}-{self.run}-{n:05d}.parquet"
            moves.append((f.path, f"{rel_dir}/{name}" if rel_dir else name, f.size))

        pending_path = self.layout.pending(self.run, batch_id)
        self.fs.write_json(pending_path, {
            "batch_id": batch_id, "files": [join(self.layout.table, rel) for _, rel, _ in moves],
        })
        for i, (src, rel, _) in enumerate(moves):
            if i == len(moves) // 2 and i > 0:
                fault_point("mid_publish", batch_id)
            self.fs.replace(src, join(self.layout.table, rel))
        fault_point("after_publish", batch_id)

        manifest = {
            "batch_id": batch_id,
            "app_id": self.app_id,
            "files": [{"path": rel, "bytes": size} for _, rel, size in moves],
            "committed_at": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
            **info,
        }
        path = self.layout.manifest(self.run, batch_id)
        if not self.fs.write_once(path, json.dumps(manifest, indent=1, sort_keys=True)):
            raise SinkError(
                f"batch {batch_id} of app {self.app_id} was committed by another writer while "
                f"this one published it ({path}): two lakesink processes share this "
                "checkpoint. Stop one of them; each table needs exactly one writer.")
        fault_point("after_manifest", batch_id)
        self.fs.delete(pending_path, recursive=False)
        self.fs.delete(staging)
        size = sum(s for _, _, s in moves)
        self.measured(int(info.get("written", 0)), size)
        self._learn_dictionaries(batch_id, moves)
        return BatchResult(batch_id, files=len(moves), bytes=size, info=info)

