"""``table.files_per_partition`` on the Arrow path: a partition folder's files of one
batch merged to at most that many.

Each Arrow task writes one file per partition folder it has rows for, so a batch of
``t`` tasks leaves up to ``t`` files in every folder (the demo: 48 files for 24
folders). Spark's writer shuffles the rows by folder instead. Here the tasks stage their
rows as Arrow IPC files (``TaskSpec.stage_format``: no Parquet encoding, read back
without decoding) in the batch's staging folder, and the merge (the driver for a small
batch, else a second, small Spark job, a task per core, in the staging's warm Python
workers) writes each folder's Parquet
files from them: ``files_per_partition`` files
(more when ``table.target_file_size`` caps a file's rows), rows in the order the
batch's tasks wrote them. So every row is still encoded as Parquet once. Only these
files are committed; the staged ones never are (Parquet: removed with the batch's
staging folder; Delta: its staging folder, outside the table, removed before the
commit). Nothing is committed before the merge succeeds, so a failure or a kill there
is an uncommitted attempt like any other: the batch is written again. A small batch (at
most :data:`DRIVER_ROWS` rows) is merged by the driver itself, with the same code: a
Spark job would cost more than its work (a low-traffic stream's batches).

Only the tasks' own files are merged; rows only Spark's decoder accepted (rare: records
the tasks could not certify) are written by Spark's writer beside them, one more file in
their folder.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from lakesink.pipeline.arrow_task import TaskSpec

#: a batch of at most this many rows is merged on the driver, not in a Spark job
DRIVER_ROWS = 100_000

#: (path below the folder the files were written to, rows, bytes, Delta statistics)
Reported = tuple[str, int, int, "str | None"]


@dataclass(frozen=True)
class Merge:
    """One partition folder's files of a batch, to be written again as ``parts`` files."""

    folder: str  #: the partition folder (``c1=v1/c2=v2``; ``""`` for the table's root)
    inputs: tuple[str, ...]  #: the files, below the folder they were written to
    parts: int
    rows: int = field(default=0, compare=False)  #: the folder's rows in the batch


def plan(reported: Sequence[Reported], files_per_partition: int,
         rows_per_file: int | None) -> list[Merge]:
    """Every folder of the batch's staged files (Arrow IPC, not the table's format: a
    folder with a single staged file is written again too), each into
    ``files_per_partition`` files (0: no merge), or as many as ``rows_per_file`` needs."""
    if files_per_partition <= 0:
        return []
    by_folder: dict[str, list[Reported]] = {}
    for entry in reported:
        by_folder.setdefault(entry[0].rpartition("/")[0], []).append(entry)
    merges = []
    for folder, files in by_folder.items():
        rows = sum(f[1] for f in files)
        parts = max(files_per_partition,
                    math.ceil(rows / rows_per_file) if rows_per_file else 1)
        merges.append(Merge(folder, tuple(f[0] for f in files), parts, rows))
    return merges


def merge_in_tasks(spark: SparkSession, spec: TaskSpec, merges: list[Merge], source: str,
                   target: str, file_tag: str = "") -> list[Reported]:
    """Run ``merges`` in Spark tasks: each folder's files under ``source`` are read and
    written again under ``target`` (both as the tasks' filesystem spells them), each
    file whole or absent. Returns the new files, as the tasks report theirs.

    A ``mapInArrow`` job, like the staging's: its tasks run in the Python workers the
    staging left warm (an RDD job's Python runner is keyed by other settings, and would
    start a second pool of workers: 0.3 GiB and a cold start per batch). A task per
    core, the folders spread over them by rows."""
    if not merges:
        return []
    if sum(m.rows for m in merges) <= DRIVER_ROWS:
        return list(_merge_task(spec, source, target, file_tag, iter(merges)))
    slices = spread(merges, spark.sparkContext.defaultParallelism)
    job = functools.partial(_merge_slices, spec, source, target, file_tag, slices)
    n = len(slices)
    return [tuple(r) for r in spark.range(0, n, 1, n).mapInArrow(job, MERGED_DDL).collect()]


#: what a merge task reports: a :data:`Reported` per file
MERGED_DDL = "path string, rows long, bytes long, stats string"
_MERGED_COLUMNS = ("path", "rows", "bytes", "stats")


def spread(merges: Sequence[Merge], slots: int) -> list[list[Merge]]:
    """``merges`` in at most ``slots`` slices of about equal rows (the largest folder
    first, each to the slice with the fewest rows so far)."""
    slices: list[list[Merge]] = [[] for _ in range(max(1, min(slots, len(merges))))]
    rows = [0] * len(slices)
    for merge in sorted(merges, key=lambda m: -m.rows):
        i = rows.index(min(rows))
        slices[i].append(merge)
        rows[i] += merge.rows
    return slices


def _merge_slices(spec: TaskSpec, source: str, target: str, file_tag: str,
                  slices: list[list[Merge]], ids: Iterator[pa.RecordBatch]
                  ) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    schema = pa.schema(list(zip(_MERGED_COLUMNS, (pa.string(), pa.int64(), pa.int64(),
                                                  pa.string()), strict=True)))
    for batch in ids:
        for i in batch.column(0).to_pylist():
            out = list(_merge_task(spec, source, target, file_tag, iter(slices[i])))
            yield pa.RecordBatch.from_arrays(
                [pa.array([r[k] for r in out], f.type) for k, f in enumerate(schema)],
                schema=schema)


def _merge_task(spec: TaskSpec, source: str, target: str, file_tag: str,
                merges: Iterator[Merge]) -> Iterator[Reported]:
    import pyarrow as pa
    from pyspark import TaskContext

    from lakesink.pipeline.arrow_task import file_stats, parquet_bytes, put

    fs = spec.open_filesystem()
    # the attempt in the name, as the tasks' files have it: a second attempt of this task
    # (a speculative copy, a lost executor's straggler) never opens a file the first one
    # reported — on Azure, opening a name empties its blob until the stream closes
    context = TaskContext.get()
    attempt = f"-{context.taskAttemptId()}" if context is not None else ""
    for merge in merges:
        tables = []
        for rel in merge.inputs:
            with fs.open_input_file(f"{source}/{rel}") as f:
                tables.append(pa.ipc.open_file(f).read_all())
        table = pa.concat_tables(tables)
        per = max(1, math.ceil(table.num_rows / merge.parts))
        for n, offset in enumerate(range(0, table.num_rows, per)):
            piece = table.slice(offset, per)
            name = f"part-m-{n:05d}{attempt}{file_tag}.parquet"
            rel = f"{merge.folder}/{name}" if merge.folder else name
            size = put(fs, f"{target}/{rel}", parquet_bytes(piece, spec.compression))
            yield rel, piece.num_rows, size, file_stats(piece) if spec.stats else None


def merged(reported: Sequence[Reported], merges: list[Merge], outputs: list[Reported]
           ) -> list[Reported]:
    """``reported`` with each merged folder's inputs replaced by its outputs; a check
    that the rows stayed the same (a merge that lost or doubled a row stops the batch)."""
    from lakesink.errors import SinkError

    gone = {rel for m in merges for rel in m.inputs}
    kept = [r for r in reported if r[0] not in gone]
    before = sum(r[1] for r in reported)
    after = sum(r[1] for r in kept) + sum(r[1] for r in outputs)
    if before != after:
        raise SinkError(f"merging the batch's small files changed its rows from {before} "
                        f"to {after}; nothing was committed")
    return kept + list(outputs)
