"""The Spark engine: a batch decoded, counted and written by Spark's own expressions and
writers, with the table writer's commit protocol.

* **stage-then-commit** (Parquet, :attr:`~lakesink.tables.base.TableWriter.
  stages_before_commit`): one pass writes the staged files and counts (an observation
  on the write); the commit hook sees the counts before anything is published — if they
  call for a schema change, nothing is published (:class:`_EvolveFirst`), the schema
  evolves and the batch is written again; else the dead letters are staged and the files
  committed.
* **write-is-commit** (Delta): one pass that counts and carries a guard failing its job
  before the table commits anything when a row calls for a schema change or is rejected
  (:data:`~lakesink.pipeline.marker.GUARD_MESSAGE`); such a batch is then written
  *counted*: counted (and evolved) first on a cached decode, its dead letters staged,
  then written once.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from pyspark import StorageLevel
from pyspark.sql import Observation

from lakesink.pipeline.evolver import MAX_EVOLUTIONS_PER_BATCH
from lakesink.pipeline.marker import GUARD_MESSAGE
from lakesink.pipeline.marks import BatchCounts
from lakesink.pipeline.write import BatchContext, WriteOutcome

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)


class SparkEngine:
    """Writes a batch with Spark, by the writer's commit protocol."""

    def __init__(self, ctx: BatchContext) -> None:
        self.ctx = ctx

    def write(self, df: DataFrame, batch_id: int) -> WriteOutcome:
        if self.ctx.writer.stages_before_commit:
            return self.staged(df, batch_id)
        return self.guarded(df, batch_id)

    def guarded(self, df: DataFrame, batch_id: int) -> WriteOutcome:
        """Tables whose write is the commit, in one pass when no row needs a schema
        change or is rejected; else :meth:`counted`."""
        marker, writer = self.ctx.marker, self.ctx.writer
        marked = marker.mark(df)
        observation = Observation(f"lakesink_batch_{batch_id}_{time.monotonic_ns()}")
        observed = marked.observe(observation, *marker.aggregates())
        seen: dict[str, Any] = {}

        def commit_info() -> dict[str, Any]:
            seen["counts"] = marker.observed(observation, marked)
            seen["info"] = self.ctx.commit_info(seen["counts"], marked, batch_id)
            return seen["info"]

        try:
            result = writer.write_batch(batch_id, marker.good(observed, guarded=True),
                                        commit_info=commit_info,
                                        recount=marker.recount(df))
        except Exception as exc:
            if GUARD_MESSAGE not in str(exc):
                raise
            logger.info("batch %d: a record calls for a schema change or is rejected; the "
                        "write was stopped before its commit and runs again after the "
                        "change and the dead letters are staged", batch_id)
            return self.counted(df, batch_id)
        return WriteOutcome(result, seen.get("counts") or BatchCounts(),
                            seen.get("info") or {"written": 0}, marked)

    def counted(self, df: DataFrame, batch_id: int) -> WriteOutcome:
        """Tables whose write is the commit, when the schema must change or records are
        rejected: count (and evolve) first, on a cached decode, stage the dead letters,
        then write once."""
        ctx = self.ctx
        marker = ctx.marker
        marked = marker.mark(df).persist(StorageLevel.MEMORY_AND_DISK_DESER)
        try:
            counts = marker.count(marked)
            for _ in range(MAX_EVOLUTIONS_PER_BATCH):
                if not ctx.evolver.needed(counts) or not ctx.evolver.evolve(marked, counts,
                                                                              batch_id):
                    break
                marked.unpersist()
                marked = marker.mark(df).persist(StorageLevel.MEMORY_AND_DISK_DESER)
                counts = marker.count(marked)
            counts = ctx.stage_dead_letters(marked, counts, batch_id)
            info = ctx.commit_info(counts, marked, batch_id)
            good = marker.good(marked)
            result = ctx.writer.write_batch(batch_id, good, commit_info=lambda: info,
                                            recount=lambda: good.count())
        except BaseException:
            marked.unpersist()
            raise
        return WriteOutcome(result, counts, info, marked)

    def staged(self, df: DataFrame, batch_id: int) -> WriteOutcome:
        """Tables that stage before they commit: one pass that writes and counts; if the
        counts call for a schema change, the staged files are dropped (nothing was
        published), the schema evolves and the batch is written again."""
        ctx = self.ctx
        marker = ctx.marker
        evolve_allowed = True
        for attempt in range(MAX_EVOLUTIONS_PER_BATCH + 1):
            marked = marker.mark(df)
            observation = Observation(f"lakesink_batch_{batch_id}_{time.monotonic_ns()}")
            observed = marked.observe(observation, *marker.aggregates())
            seen: dict[str, Any] = {}

            def commit_info(observation: Observation = observation, marked: DataFrame = marked,
                            seen: dict[str, Any] = seen, allowed: bool = evolve_allowed,
                            last: bool = attempt == MAX_EVOLUTIONS_PER_BATCH
                            ) -> dict[str, Any]:
                counts = marker.observed(observation, marked)
                seen["counts"] = counts
                if allowed and not last and ctx.evolver.needed(counts):
                    raise _EvolveFirst
                seen["counts"] = counts = ctx.stage_dead_letters(marked, counts, batch_id)
                seen["info"] = ctx.commit_info(counts, marked, batch_id)
                return seen["info"]

            try:
                result = ctx.writer.write_batch(batch_id, marker.good(observed),
                                                commit_info=commit_info,
                                                recount=marker.recount(df))
            except _EvolveFirst:
                evolve_allowed = ctx.evolver.evolve(marked, seen["counts"], batch_id)
                continue
            return WriteOutcome(result, seen.get("counts") or BatchCounts(),
                                seen.get("info") or {"written": 0}, marked)
        raise AssertionError("unreachable: the last attempt never evolves")


class _EvolveFirst(Exception):
    """Raised from a staged write's commit hook: drop the staged files, evolve, redo."""
