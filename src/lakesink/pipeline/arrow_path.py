"""The driver half of the Arrow data path (``table.engine: arrow``).

Spark still reads Kafka (offsets, security, scale-out) and plans the tasks; the per-row
work moves out of JVM row expressions into pyarrow inside the tasks
(:mod:`lakesink.pipeline.arrow_task`). Per micro-batch, inside the same exactly-once
frame as the Spark path (:class:`~lakesink.tables.parquet.ParquetTableWriter`):

1. **begin** the batch (an earlier attempt's leftovers are removed);
2. **stage**: ``mapInArrow`` over the raw records; each task decodes, certifies and
   writes its good rows to ``staging/<run>/<b>/a/`` and returns its files, its record
   count and its *suspects* (records it does not certify) — one Spark job;
3. **suspects** go through Spark's decoder, the same code as the Spark path: their
   counts may evolve the schema (then the whole batch is redone with the new schema),
   their dead letters are staged in the outbox, and the good ones among them are
   written by Spark to ``staging/<run>/<b>/s/``;
4. **commit**: the files the tasks reported (never a listing: a failed task attempt's
   leftovers are not the batch's) and Spark's are checked against the counted rows
   (footers), published and recorded in the manifest.

The batch's record count is Spark's, not the tasks': the JVM counts the records it hands
to the tasks (an observation on the ``mapInArrow`` input), and every one of them must
come back as a written row or a suspect (:meth:`StagedByTasks.check_accounted`) before
anything is committed — a task that loses a record cannot also lose it from the count.

Why ``foreachBatch`` + ``mapInArrow`` rather than a Python streaming data source's
``DataSourceStreamArrowWriter``: the batch function already owns skip-if-committed,
schema evolution, dead letters and the lease, and the suspects need a Spark job of their
own between the tasks and the commit; a data source writer's ``commit(messages,
batchId)`` would have to do all of that from inside Spark's commit protocol.

Which tables take this path is decided per table and schema (:func:`arrow_spec`);
the rest stay on the Spark path, said once in the log.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.errors import CommitMismatch, one_line
from lakesink.decode.json import JsonDecoder
from lakesink.pipeline.arrow_task import (
    ARROW_TYPES,
    RAW_COLUMNS,
    RESULT_DDL,
    TaskSpec,
    run_task,
    warm_up,
)
from lakesink.pipeline.marker import observation_values
from lakesink.tables.fs import join, task_path
from lakesink.tables.formats import table_format
from lakesink.sources.record_shape import RECORD_DDL

if TYPE_CHECKING:
    import threading

    from pyspark.sql import DataFrame, SparkSession

    from lakesink.decode.base import Decoder
    from lakesink.pipeline.columns import PartitionSpec, SourceColumns
    from lakesink.pipeline.transforms import Transforms
    from lakesink.tables.base import TableWriter

logger = logging.getLogger(__name__)

#: partition folder values Spark and this path spell alike (floats print differently)
_FOLDER_TYPES = ("string", "boolean", "tinyint", "smallint", "int", "bigint")
_TIMESTAMP_TYPES = ("string", "tinyint", "smallint", "int", "bigint", "float", "double",
                    "timestamp", "date")


class NotArrow(str):
    """Why a table stays on the Spark path; ``by_schema``: because of its (possibly
    evolved) schema, not of its configuration."""

    by_schema = False


class NotArrowSchema(NotArrow):
    by_schema = True


#: Spark settings under which Spark reads and writes timestamp and date fields the way
#: the tasks do (Spark 4's defaults; lakesink's for the output type)
TIME_SETTINGS = {"spark.sql.legacy.timeParserPolicy": "CORRECTED",
                 "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
                 "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED"}


def time_settings_refusal(spark: SparkSession) -> str | None:
    """Why timestamp and date fields must take the Spark path in this session (None:
    they need not): a legacy parser reads ``.5`` as 5 ms and old dates in the Julian
    calendar, a rebase writes them so, and other output types change the unit."""
    for key, wanted in TIME_SETTINGS.items():
        value = str(spark.conf.get(key, wanted))
        if value.upper() != wanted:
            return f"{key} is {value}"
    return None


def arrow_spec(*, decoder: Decoder, transforms: Transforms, writer: TableWriter,
               schema: T.StructType, partitions: PartitionSpec,
               source_columns: SourceColumns,
               filesystem: tuple[str, dict[str, Any]] | str,
               time_refusal: str | None = None) -> TaskSpec | NotArrow:
    """The tasks' spec for this table, or why the table stays on the Spark path.
    ``filesystem``: :func:`lakesink.runtime.storage.task_filesystem` of the table;
    ``time_refusal``: :func:`time_settings_refusal` of the session."""
    refused = writer.arrow_refusal()
    if refused:
        return NotArrow(refused)
    if isinstance(filesystem, str):
        return NotArrow(filesystem)
    if type(decoder) is not JsonDecoder:
        return NotArrow("the Arrow path decodes JSON so far")
    if transforms:
        return NotArrow("tables with transforms run them as Spark SQL")
    fields = []
    for f in schema.fields:
        name = f.dataType.simpleString()
        if name not in ARROW_TYPES:
            return NotArrowSchema(f"field {f.name!r} is a {name} (the Arrow path reads "
                                  f"{', '.join(ARROW_TYPES)})")
        if name in ("timestamp", "date") and time_refusal:
            return NotArrowSchema(f"field {f.name!r} is a {name} and {time_refusal}")
        fields.append((f.name, name, f.nullable))
    types = dict((n, t) for n, t, _ in fields)
    for col in partitions.columns:
        if col not in partitions.derived and types.get(col) not in _FOLDER_TYPES:
            return NotArrowSchema(f"partition column {col!r} is a {types.get(col)}")
    if partitions.timestamp_column and types.get(partitions.timestamp_column) \
            not in _TIMESTAMP_TYPES:
        return NotArrowSchema(f"timestamp column {partitions.timestamp_column!r} is a "
                              f"{types.get(partitions.timestamp_column)}")
    return TaskSpec(
        fields=tuple(fields), partition_by=tuple(partitions.columns),
        timestamp_column=partitions.timestamp_column,
        use_kafka_timestamp=partitions.use_kafka_timestamp,
        null_value=partitions.null_value, derived=tuple(partitions.derived),
        key_column=source_columns.key_column, key_format=source_columns.key_format,
        metadata_column=source_columns.metadata_column, compression=writer.compression,
        filesystem=filesystem, stats=table_format(writer.format).has_log,
        ascii_folders=partitions.ascii_folders)


def _in_task(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        yield from run_task(spec, batches, 0)
    else:
        yield from run_task(spec, batches, context.partitionId(), context.taskAttemptId())


class StagedByTasks:
    """What the tasks of one batch reported; ``read``: the records Spark handed them
    (counted in the JVM, not by the tasks)."""

    def __init__(self, results: pa.Table, folder: str, read: int | None = None) -> None:
        self.read = read
        kind = results.column("kind")
        files = results.filter(pc.equal(kind, "file")).sort_by("path")
        self.files = [(join(folder, rel), rel, int(size)) for rel, size in zip(
            files.column("path").to_pylist(), files.column("bytes").to_pylist(), strict=True)]
        #: (path below ``folder``, rows, bytes, Delta statistics) per file
        self.reported = list(zip(*(files.column(c).to_pylist()
                                   for c in ("path", "rows", "bytes", "stats")), strict=True))
        self.rows = sum(files.column("rows").to_pylist())
        self.records = sum(results.filter(pc.equal(kind, "count")).column("rows").to_pylist())
        self.suspects = results.filter(pc.equal(kind, "suspect")).select(list(RAW_COLUMNS))
        #: a task had more suspects than it hands back: the batch takes the Spark path
        self.overflow = bool(pc.any(pc.equal(kind, "overflow")).as_py())

    def check_accounted(self, batch_id: int, table: str) -> None:
        """Every record Spark handed the tasks came back as a written row or a suspect,
        and the tasks counted them all (else :class:`~lakesink.errors.CommitMismatch`:
        nothing of the batch is committed, the query stops). Not for an overflow, whose
        tasks stopped early."""
        back = self.rows + self.suspects.num_rows
        if self.read is not None and self.read == back == self.records:
            return
        raise CommitMismatch(
            f"batch {batch_id} of {table}: Spark handed the Arrow tasks {self.read} "
            f"record(s), they counted {self.records} and accounted for {back} ({self.rows} "
            f"row(s) written, {self.suspects.num_rows} handed back); nothing was "
            "committed. This is a lakesink bug: please report it with this message")


#: records a task decodes at a time when its rows are merged afterwards (Arrow IPC
#: staging): each chunk stages files of its own, which the merge joins, so a smaller
#: chunk costs no file; it bounds the Python worker's memory (262,144 -> 32,768: 130 MiB
#: less peak RSS per worker at 1 M events, bench/results/memory-2026-12-06.md)
MERGED_CHUNK_ROWS = 32_768


def stage_in_tasks(df: DataFrame, spec: TaskSpec, folder: str, rows_per_file: int | None,
                   file_tag: str = "", stage_format: str = "parquet") -> StagedByTasks:
    """Step 2: one Spark job; each task stages its good rows under ``folder``, its file
    names ending in ``file_tag``, as Parquet or Arrow IPC (``stage_format``)."""
    tasks = max(1, df.rdd.getNumPartitions())
    spec = replace(spec, staging=task_path(spec.filesystem, folder), rows_per_file=rows_per_file,
                   file_tag=file_tag, stage_format=stage_format,
                   **task_suspect_share(spec, tasks))
    if stage_format == "arrow":  # the merge writes the files: chunks do not make them
        spec = replace(spec, chunk_rows=min(spec.chunk_rows, MERGED_CHUNK_ROWS))
    raw = df.select(*RAW_COLUMNS)
    observation = Observation(f"lakesink_read_{time.monotonic_ns()}")
    results = (raw.observe(observation, F.count(F.lit(1)).alias("records"))
               .mapInArrow(functools.partial(_in_task, spec), RESULT_DDL)
               .toArrow())
    read = observation_values(observation).get("records")
    if read is None:  # Spark reported no metrics: count the input again, in the JVM
        read = raw.count()
    return StagedByTasks(results, folder, int(read))


def task_suspect_share(spec: TaskSpec, tasks: int) -> dict[str, int]:
    """Each of ``tasks`` tasks' share of the batch's suspect budget (records and bytes
    handed back to the driver): the batch's together stay under
    :data:`~lakesink.pipeline.arrow_task.BATCH_SUSPECT_BYTES`, whatever the number of
    partitions (a task's own cap, ``spec.max_suspects``, stays the most)."""
    from lakesink.pipeline.arrow_task import (
        BATCH_SUSPECT_BYTES,
        BATCH_SUSPECTS,
        MIN_TASK_SUSPECT_BYTES,
    )

    return {"max_suspects": max(1, min(spec.max_suspects, BATCH_SUSPECTS // tasks)),
            "suspect_bytes": max(MIN_TASK_SUSPECT_BYTES,
                                 min(spec.suspect_bytes, BATCH_SUSPECT_BYTES // tasks))}


#: the Spark job tag of the workers' warm-up (see :func:`warm_workers`)
WARM_UP_TAG = "lakesink-warm-up"


def pinned_threads() -> bool:
    """Whether each Python thread has a JVM thread of its own (PySpark's pinned-thread
    mode, its default; ``PYSPARK_PIN_THREAD=false`` turns it off). Only then does a job
    tag set on one Python thread stay with that thread's jobs: without it the tag would
    stay on a pooled JVM thread that serves the other threads' calls too."""
    from py4j.clientserver import ClientServer
    from pyspark import SparkContext

    return isinstance(SparkContext._gateway, ClientServer)  # noqa: SLF001 - as PySpark does


def warm_workers(spark: SparkSession, spec: TaskSpec,
                 cancelled: threading.Event | None = None) -> float | None:
    """Start the Python workers (one per task slot) and do their once-only work
    (:func:`~lakesink.pipeline.arrow_task.warm_up`) beside the query's start (on a thread
    of its own), instead of in its first batch. Returns the seconds it took, None when
    it was cancelled (``cancelled`` set, then ``cancelJobsWithTag(WARM_UP_TAG)``: a run
    that ends first does not wait for it; Spark stops the job's Python workers as it
    does a killed task's). Its job carries :data:`WARM_UP_TAG` in pinned-thread mode
    (:func:`pinned_threads`; without it nothing is tagged, and a run waits for the
    warm-up). Any other failure only means a slower first batch: it is logged, never
    raised."""
    started = time.monotonic()
    sc = spark.sparkContext
    slots = max(1, sc.defaultParallelism)
    tagged = cancelled is not None and pinned_threads()
    if tagged:
        sc.addJobTag(WARM_UP_TAG)  # this thread's jobs only
    try:
        (spark.range(0, slots, 1, slots)
         .mapInArrow(functools.partial(_warm, spec), "ok boolean").collect())
    except Exception as exc:  # noqa: BLE001 - an optimisation, not a step of the data path
        if cancelled is not None and cancelled.is_set():
            return None
        logger.warning("warming up the Python workers failed (%s): the first batch does "
                       "it", one_line(exc, name=False) or exc)
    finally:
        if tagged:
            with contextlib.suppress(Exception):  # Spark stopped: the thread ends anyway
                sc.removeJobTag(WARM_UP_TAG)
    return time.monotonic() - started


def _warm(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        pass
    warm_up(spec)
    yield pa.RecordBatch.from_pydict({"ok": [True]})


def suspects_frame(df: DataFrame, suspects: pa.Table) -> DataFrame:
    """The suspects as a DataFrame of raw records, for Spark's decoder."""
    spark = df.sparkSession
    return spark.createDataFrame(suspects, schema=RECORD_DDL)
