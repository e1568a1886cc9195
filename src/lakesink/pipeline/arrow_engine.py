"""The Arrow engine: a batch decoded and written by pyarrow inside Spark's tasks
(:mod:`lakesink.pipeline.arrow_path`), committed by the driver.

1. **tasks**: each task decodes its records, writes the ones it certifies as files
   (Parquet: in the batch's staging folder; Delta: in place, under names carrying the
   batch, the run and a nonce — invisible until a commit lists them) and hands back the
   records it does not certify (the *suspects*);
2. **suspects**: Spark's decoder (the mark stage, the Spark engine's own code) judges
   them in one cached pass: dead letters, rows it accepts, or a schema change;
3. **dead letters** are staged in the outbox before the commit; a schema change drops
   the attempt (Parquet: evolve and write the batch again; Delta: the Spark engine
   writes it with ``mergeSchema``);
4. **merge** (``table.files_per_partition`` > 0, a partitioned table): the tasks
   staged their rows as Arrow IPC; a second small job writes each folder's Parquet
   files from them, as many as the setting allows
   (:mod:`lakesink.pipeline.arrow_merge`), before anything is committed;
5. **commit**: the tasks' files and the accepted suspects' together, with counts the
   writer checks against an exact recount when they disagree.

Whatever it cannot do — too many suspects in a task, a schema the tasks do not read, a
Delta table delta-rs refuses — it returns as a :class:`~.write.Fallback`, before anything
of its attempt is committed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark import StorageLevel

from lakesink.errors import CommitMismatch, FilesRefused
from lakesink.faults import fault_point
from lakesink.pipeline import arrow_merge
from lakesink.pipeline.arrow_path import stage_in_tasks, suspects_frame
from lakesink.pipeline.evolver import MAX_EVOLUTIONS_PER_BATCH
from lakesink.pipeline.marks import BatchCounts
from lakesink.pipeline.write import BatchContext, Fallback, WriteOutcome
from lakesink.tables.base import BatchResult
from lakesink.tables.fs import join, task_path
from lakesink.tables.identity import run_tag

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakesink.pipeline.arrow_path import StagedByTasks
    from lakesink.pipeline.arrow_task import TaskSpec

logger = logging.getLogger(__name__)

#: the Spark engine takes the batch, already said (the engine choice logged it)
SAID = Fallback("")


class ArrowEngine:
    """Writes a batch in the tasks; ``spec()`` is the current schema's task spec (None
    when the schema is one the tasks do not read)."""

    def __init__(self, ctx: BatchContext, spec: Callable[[], TaskSpec | None]) -> None:
        self.ctx = ctx
        self.spec = spec
        self._said_refused: str | None = None  # why a Delta table refuses files, as said

    def write(self, df: DataFrame, batch_id: int) -> WriteOutcome | Fallback:
        """By the table's commit protocol: stage-then-commit (Parquet) or files in place
        committed by a log entry (Delta)."""
        if self.ctx.writer.stages_before_commit:
            return self._staged(df, batch_id)
        return self._in_place(df, batch_id)

    def _staged(self, df: DataFrame, batch_id: int) -> WriteOutcome | Fallback:
        """Staged by the tasks (and Spark's writer, for the accepted suspects), then
        published under the batch's names and its manifest (``commit_staged``: the
        Parquet writer)."""
        ctx = self.ctx
        writer: Any = ctx.writer  # ParquetTableWriter
        for attempt in range(MAX_EVOLUTIONS_PER_BATCH + 1):
            spec = self.spec()
            if spec is None:  # an evolved schema the Arrow path does not read
                return SAID
            if writer.skip_committed(batch_id):
                return WriteOutcome(BatchResult(batch_id, skipped=True), BatchCounts(), {})
            rows_per_file = writer.begin(batch_id)
            staging = writer.layout.staging(writer.run, batch_id)
            tasks = stage_in_tasks(df, spec, join(staging, "a"), rows_per_file,
                                   stage_format=self._stage_format())
            if tasks.overflow:  # Spark's path does it in one pass
                return _overflow(spec, batch_id)
            tasks.check_accounted(batch_id, writer.layout.table)
            fault_point("after_staging", batch_id)
            staged = self._merged(df, spec, tasks, join(staging, "a"), join(staging, "m"),
                                  rows_per_file)
            suspects = self._judge(df, tasks)
            if (suspects.found is not None and attempt < MAX_EVOLUTIONS_PER_BATCH
                    and ctx.evolver.needed(suspects.found)
                    and ctx.evolver.evolve(suspects.marked, suspects.found, batch_id)):
                suspects.drop()
                continue  # the whole batch again, with the new schema
            counts = self._settle(suspects, tasks, batch_id)
            spark_files = []
            if suspects.accepted:
                folder = join(staging, "s")
                writer.stage(ctx.marker.good(suspects.marked), folder, rows_per_file)
                spark_files = writer.listed(folder)
            info, recount = self._commit_inputs(counts, suspects, tasks, batch_id)
            result = writer.commit_staged(
                batch_id, writer.named(batch_id, staged + spark_files), info,
                rows_per_file, recount=recount)
            return WriteOutcome(result, counts, info, suspects.marked)
        raise AssertionError("unreachable: the last attempt never evolves")

    def _in_place(self, df: DataFrame, batch_id: int) -> WriteOutcome | Fallback:
        """Written in place by the tasks (and Spark's writer, for the accepted suspects,
        moved in beside them); one log commit adds the files with the batch's
        ``SetTransaction`` (``commit_files``: the Delta writer's
        :class:`~lakesink.tables.delta_files.DeltaFiles`)."""
        ctx = self.ctx
        writer: Any = ctx.writer  # DeltaTableWriter
        spec = self.spec()
        assert spec is not None
        writer.ensure_table(lambda: ctx.marker.good(ctx.marker.mark(df.limit(0))))
        refused = writer.files_refusal()
        if refused:
            if self._said_refused == refused:
                return SAID
            self._said_refused = refused
            return Fallback("%s: Delta batches take Spark's writer: %s",
                            (writer.layout.table, refused), logging.WARNING)
        lacking = writer.lacks_columns(ctx.marker.memo("delta_columns",
                                                       lambda: _delta_columns(spec)))
        if lacking:
            return Fallback("batch %d: the Delta table lacks column(s) %s of the schema: "
                            "the batch takes Spark's writer, which adds them",
                            (batch_id, ", ".join(lacking)))
        rows_per_file = writer.rows_per_file()
        # file names of this attempt: the batch, the run, and a nonce (Spark's task
        # attempt ids restart with every process)
        nonce = uuid.uuid4().hex[:8]
        tag = f"-b{batch_id:010d}-{run_tag(ctx.app_id)}-{nonce}"
        stage_format = self._stage_format()
        # staged for the merge: outside the table, a folder per attempt (removed once
        # merged, and with every attempt's once the batch is committed)
        staging = (join(writer.layout.staging(run_tag(ctx.app_id), batch_id), nonce)
                   if stage_format == "arrow" else None)
        tasks = stage_in_tasks(df, spec, staging or writer.layout.table, rows_per_file,
                               file_tag=tag, stage_format=stage_format)
        if tasks.overflow:
            _drop_staged(writer, tasks, staging)
            return _overflow(spec, batch_id)
        try:
            tasks.check_accounted(batch_id, writer.layout.table)
        except CommitMismatch:  # files in place no commit lists: not left behind
            _drop_staged(writer, tasks, staging)
            raise
        fault_point("after_staging", batch_id)
        suspects = self._judge(df, tasks)
        try:
            if suspects.found is not None and ctx.evolver.needed(suspects.found):
                suspects.drop()
                _drop_staged(writer, tasks, staging)
                return Fallback("batch %d: the schema changes: the batch takes the Spark "
                                "path", (batch_id,))
            counts = self._settle(suspects, tasks, batch_id)
            files = self._merged_in_place(df, spec, tasks, rows_per_file, tag, staging)
            if suspects.accepted:
                files += writer.stage_in_place(ctx.marker.good(suspects.marked), batch_id,
                                               rows_per_file, tag)
            info, recount = self._commit_inputs(counts, suspects, tasks, batch_id)
            result = writer.commit_files(batch_id, files, info, recount=recount)
            if staging is not None:  # every attempt's staged rows of the batch
                writer.fs.delete(writer.layout.staging(run_tag(ctx.app_id), batch_id))
        except FilesRefused as refused:  # nothing committed: Spark's writer, from scratch
            suspects.drop()
            # the tasks' files and the staged dead letters stay: a put whose fate was
            # unknown may still land and list the files, and Spark's writer then skips
            # the batch by its txn, so the outbox staged here is the batch's; else the
            # Spark path stages its own in its place (stage replaces an outbox)
            return Fallback("%s: %s; this batch and the next take Spark's Delta writer",
                            (writer.layout.table, refused), logging.WARNING)
        except BaseException:
            suspects.drop()
            raise
        return WriteOutcome(result, counts, info, suspects.marked)

    # -- the steps both formats share --------------------------------------------------

    def _stage_format(self) -> str:
        """``arrow`` when the batch's files are merged per folder (Arrow IPC staged for
        :mod:`~lakesink.pipeline.arrow_merge`), else ``parquet`` (the table's files)."""
        writer = self.ctx.writer
        return "arrow" if writer.partition_by and writer.files_per_partition > 0 \
            else "parquet"

    def _merges(self, tasks: StagedByTasks, rows_per_file: int | None
                ) -> list[arrow_merge.Merge]:
        if self._stage_format() != "arrow":
            return []
        return arrow_merge.plan(tasks.reported, self.ctx.writer.files_per_partition,
                                rows_per_file)

    def _merged(self, df: DataFrame, spec: TaskSpec, tasks: StagedByTasks, source: str,
                target: str, rows_per_file: int | None) -> list[tuple[str, str, int]]:
        """Step 4, staged: (path, path below its folder, bytes) of the batch's files, a
        folder's small ones merged from ``source`` into ``target``."""
        merges = self._merges(tasks, rows_per_file)
        if not merges:
            return tasks.files
        fs = spec.filesystem
        outputs = arrow_merge.merge_in_tasks(df.sparkSession, spec, merges,
                                             task_path(fs, source), task_path(fs, target))
        made = {rel for rel, *_ in outputs}
        return [(join(target if rel in made else source, rel), rel, size)
                for rel, _, size, _ in arrow_merge.merged(tasks.reported, merges, outputs)]

    def _merged_in_place(self, df: DataFrame, spec: TaskSpec, tasks: StagedByTasks,
                         rows_per_file: int | None, tag: str, staging: str | None
                         ) -> list[Any]:
        """Step 4, in place: the batch's files as the tasks report them, or — staged in
        ``staging`` for the merge — each folder's files written into the table from
        them (named with the attempt's ``tag``), the staged ones removed."""
        merges = self._merges(tasks, rows_per_file)
        if staging is None or not merges:
            return list(tasks.reported)
        writer: Any = self.ctx.writer
        fs = spec.filesystem
        outputs = arrow_merge.merge_in_tasks(df.sparkSession, spec, merges,
                                             task_path(fs, staging),
                                             task_path(fs, writer.layout.table), tag)
        files = arrow_merge.merged(tasks.reported, merges, outputs)
        writer.fs.delete(staging)
        return files

    def _judge(self, df: DataFrame, tasks: StagedByTasks) -> _Suspects:
        """Step 2: the records the tasks did not certify, through Spark's decoder (the
        Spark path's own code), counted in one cached pass."""
        if not tasks.suspects.num_rows:
            return _Suspects(None, None)
        marker = self.ctx.marker
        marked = marker.mark(suspects_frame(df, tasks.suspects)).persist(
            StorageLevel.MEMORY_AND_DISK_DESER)
        try:
            return _Suspects(marked, marker.count(marked))
        except BaseException:
            marked.unpersist()
            raise

    def _settle(self, suspects: _Suspects, tasks: StagedByTasks, batch_id: int
                ) -> BatchCounts:
        """Step 3 (no schema change pending): the suspects' dead letters staged in the
        outbox; the batch's counts."""
        if suspects.found is None:
            return BatchCounts(records=tasks.records)
        assert suspects.marked is not None
        suspects.found = found = self.ctx.stage_dead_letters(suspects.marked,
                                                             suspects.found, batch_id)
        return BatchCounts(records=tasks.records, rejected=found.rejected,
                           unknown=found.unknown)

    def _commit_inputs(self, counts: BatchCounts, suspects: _Suspects, tasks: StagedByTasks,
                       batch_id: int) -> tuple[dict[str, Any], Callable[[], int]]:
        """Step 4's inputs: the commit's info (rows the tasks wrote included), and an
        exact recount of the batch's good rows for a commit whose counts disagree."""
        ctx = self.ctx
        info = {**ctx.commit_info(counts, suspects.marked, batch_id), "arrow_rows": tasks.rows}
        good = ctx.marker.good(suspects.marked) if suspects.marked is not None else None
        return info, lambda: tasks.rows + (good.count() if good is not None else 0)


def _drop_staged(writer: Any, tasks: StagedByTasks, staging: str | None) -> None:  # noqa: ANN401
    """The files the tasks wrote for a Delta batch that is not committed from them:
    their staging folder, or (written in place) each file."""
    if staging is not None:
        writer.fs.delete(staging)
    else:
        writer.drop_files([rel for rel, *_ in tasks.reported])


def _overflow(spec: TaskSpec, batch_id: int) -> Fallback:
    """A task had more suspects than it hands back: the Spark path judges every record
    in one pass anyway."""
    from lakesink.pipeline.arrow_task import BATCH_SUSPECT_BYTES, BATCH_SUSPECTS

    return Fallback("batch %d: too many records the Arrow path does not certify (a task "
                    "went past its share of the batch's %d records / %d MiB, or its own "
                    "%d): the batch takes the Spark path, which streams them",
                    (batch_id, BATCH_SUSPECTS, BATCH_SUSPECT_BYTES >> 20, spec.max_suspects),
                    logging.WARNING)


def _delta_columns(spec: TaskSpec) -> dict[str, str | None]:
    """The columns a Delta table needs for the Arrow path's files: the schema's (name ->
    Spark type name) and the partition, key and metadata columns (any type: partition
    values live in the log, as text)."""
    columns: dict[str, str | None] = {name: type_name for name, type_name, _ in spec.fields}
    columns.update({c: None for c in (*spec.partition_by, spec.key_column,
                                      spec.metadata_column) if c})
    return columns


@dataclass
class _Suspects:
    """An Arrow batch's suspects as Spark's decoder judged them: the marked frame
    (persisted; the batch function unpersists it) and its counts (``rejected``: as
    staged, once they are); both None when the tasks certified every record."""

    marked: DataFrame | None
    found: BatchCounts | None

    @property
    def accepted(self) -> bool:
        """Whether Spark's decoder accepted some of them (rows to write)."""
        return self.found is not None and self.found.records > self.found.rejected

    def drop(self) -> None:
        if self.marked is not None:
            self.marked.unpersist()
